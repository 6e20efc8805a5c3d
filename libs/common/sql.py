"""Named SQL: parses ``queries.sql`` (``-- name: x`` headers) once, on first use."""
from __future__ import annotations

import functools
import re
from importlib import resources

_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.M)


@functools.cache
def queries() -> dict[str, str]:
    """``{name: sql}`` for every statement in ``libs/common/queries.sql``, without its leading
    comment lines (so each text starts with its verb: ``SELECT``, ``WITH``, ``UPDATE``, …)."""
    text = resources.files("z9.common").joinpath("queries.sql").read_text()
    parts = _HEADER.split(text)
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in out:
            raise ValueError(f"query {name!r} is defined twice")
        lines = body.strip().splitlines()
        while lines and lines[0].lstrip().startswith("--"):  # the query's leading comment: for
            lines.pop(0)                                     # readers, not the server (and trace
        out[name] = "\n".join(lines).strip().rstrip(";")   # spans are named by the first word)
    return out


def q(name: str) -> str:
    """The SQL text of query ``name``; ``KeyError`` when there is none."""
    return queries()[name]


@functools.cache
def qt(name: str, table: str, status_type: str) -> str:
    """Query ``name`` written once for every resource table (``resource_*``), with ``{table}`` and
    ``{status_type}`` filled in. Both come from the resource-type registry, which validated them
    as plain identifiers: never from input."""
    return q(name).replace("{table}", table).replace("{status_type}", status_type)
