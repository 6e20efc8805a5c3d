"""Named SQL: parses ``queries.sql`` (``-- name: x`` headers) once, on first use."""
from __future__ import annotations

import functools
import math
import re
from datetime import datetime
from importlib import resources
from typing import Any

_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.M)


@functools.cache
def queries() -> dict[str, str]:
    """``{name: sql}`` for every statement in ``libs/common/z9/common/queries.sql``, without its leading
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


class _Null:
    """:data:`NULL`: an SQL ``NULL`` asked for by name (``None`` stays refused: a value left unset
    by mistake must not become one)."""

    def __repr__(self) -> str:
        return "NULL"


NULL = _Null()


def literal(value: Any) -> str:
    """``value`` as an SQL literal: ``str`` quoted (``'`` doubled; the server runs with
    ``standard_conforming_strings = on``, PostgreSQL's default since 9.1, so a backslash is an
    ordinary character), ``int`` and finite ``float`` as numbers, an aware ``datetime`` as its ISO
    text (quoted; the query casts it), :data:`NULL` as ``NULL``. Anything else (``bool``, ``None``,
    NaN, a string holding NUL, a naive ``datetime``) is refused with ``ValueError``: the caller
    passes values of known types, never raw input."""
    if value is NULL:
        return "NULL"
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("a datetime without a time zone has no SQL literal")
        return "'" + value.isoformat() + "'"
    if isinstance(value, bool) or value is None:
        raise ValueError(f"no SQL literal for {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no SQL literal for {value!r}")
        return repr(value)
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("a string holding NUL has no SQL literal")
        return "'" + value.replace("'", "''") + "'"
    raise ValueError(f"no SQL literal for {type(value).__name__}")


@functools.lru_cache(maxsize=1024)
def ql(name: str, **values: Any) -> str:
    """Query ``name`` with its ``{placeholders}`` filled in as SQL literals (:func:`literal`).

    For a statement that must carry no parameters: PostgreSQL plans a parameterless prepared
    statement once and keeps that plan (``plan_cache_mode`` only decides for statements with
    parameters, and ``force_custom_plan`` re-plans those on every execution), and a plan built
    for the literal values is the plan a custom plan would be — so the statement is planned for
    its real ``LIMIT`` and region once per connection instead of on every execution. The cached
    plan is rebuilt whenever the table's statistics or indexes change (relcache invalidation).
    Used by the claim (``job_claim``); each distinct set of values is one prepared statement per
    connection (asyncpg's statement cache), so only values with few distinct settings belong here."""
    text = q(name)
    for key, value in values.items():
        placeholder = "{" + key + "}"
        if placeholder not in text:
            raise KeyError(f"query {name!r} has no placeholder {placeholder}")
        text = text.replace(placeholder, literal(value))
    left = re.findall(r"\{[a-z_]+\}", text)
    if left:
        raise KeyError(f"query {name!r}: placeholders left unfilled: {left}")
    return text
