"""Named SQL: parses ``queries.sql`` (``-- name: x`` headers) once, on first use."""
from __future__ import annotations

import functools
import re
from importlib import resources

_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.M)


@functools.cache
def queries() -> dict[str, str]:
    """``{name: sql}`` for every statement in ``libs/common/queries.sql``."""
    text = resources.files("z9.common").joinpath("queries.sql").read_text()
    parts = _HEADER.split(text)
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in out:
            raise ValueError(f"query {name!r} is defined twice")
        out[name] = body.strip().rstrip(";")
    return out


def q(name: str) -> str:
    """The SQL text of query ``name``; ``KeyError`` when there is none."""
    return queries()[name]
