"""Named SQL, one ``.sql`` file per table (as River keeps them): the generic tables' in
``libs/common/z9/common/queries/`` (jobs, tenants, api_tokens, idempotency_keys, tenant_quota_limits,
vm_clone_requests, console_sessions, and ``resources.sql``: every resource table's lifecycle), each resource type's
in its slice (``resources/z9/resources/<type>/queries.sql``). Parsed once, on first use.

A statement stands under a ``-- name: x`` header. A piece of SQL written once for several
statements stands under ``-- fragment: x(arg, …)`` (its body names its arguments ``<arg>``) and is
used as ``{{x(value, …)}}`` (or ``{{x}}`` without arguments) in any file: expanded at load, so
PostgreSQL sees whole statements and each statement stays one round trip."""
from __future__ import annotations

import functools
import math
import re
from datetime import datetime
from importlib import resources as _files
from importlib.resources.abc import Traversable
from typing import Any

_HEADER = re.compile(r"^-- (name|fragment): ([a-z_]+)(?:\(([a-z_, ]*)\))?\s*$", re.M)
_USE = re.compile(r"\{\{([a-z_]+)(?:\(((?:[^(){}]|\([^(){}]*\)|\{[a-z_]+\})*)\))?\}\}")


def files() -> list[Traversable]:
    """Every ``.sql`` file of named queries: the generic tables', then each registered resource
    type's ``queries.sql`` (in the registry's order)."""
    from z9 import resources  # the registry imports the store, which imports this module

    out = sorted((f for f in _files.files("z9.common").joinpath("queries").iterdir() if f.name.endswith(".sql")),
                 key=lambda f: f.name)
    for t in resources.types():
        try:
            f = _files.files(t.package).joinpath("queries.sql")
        except ModuleNotFoundError:  # a type registered without a slice package (a test's)
            continue
        if f.is_file():
            out.append(f)
    return out


def _expand(text: str, fragments: dict[str, tuple[list[str], str]], where: str) -> str:
    def use(m: re.Match[str]) -> str:
        name, given = m.group(1), m.group(2)
        if name not in fragments:
            raise ValueError(f"{where}: no fragment {name!r}")
        params, body = fragments[name]
        values = [v.strip() for v in given.split(",")] if given else []
        if len(values) != len(params):
            raise ValueError(f"{where}: fragment {name} takes {params}, given {values}")
        for p, v in zip(params, values):
            body = body.replace(f"<{p}>", v)
        return body
    for _ in range(5):  # fragments may use fragments
        new = _USE.sub(use, text)
        if new == text:
            return new
        text = new
    raise ValueError(f"{where}: fragments nested too deep")


def _parse(text: str, where: str) -> list[tuple[str, str, str, str]]:
    parts = _HEADER.split(text)
    out = []
    for what, name, params, body in zip(parts[1::4], parts[2::4], parts[3::4], parts[4::4]):
        lines = body.strip().splitlines()
        while lines and lines[0].lstrip().startswith("--"):  # the leading comment: for readers,
            lines.pop(0)                                     # not the server (and trace spans are
        while lines and (not lines[-1].strip() or lines[-1].lstrip().startswith("--")):
            lines.pop()                                      # the next statement's preamble
        out.append((what, name, params or "", "\n".join(lines).strip().rstrip(";")))  # named by the first word)
    return out


@functools.cache
def fragments() -> dict[str, tuple[list[str], str]]:
    """``{name: (arguments, sql)}`` of every fragment."""
    out: dict[str, tuple[list[str], str]] = {}
    for f in files():
        for what, name, params, body in _parse(f.read_text(), f.name):
            if what == "fragment":
                if name in out:
                    raise ValueError(f"fragment {name!r} is defined twice")
                out[name] = ([p.strip() for p in params.split(",") if p.strip()], body)
    return out


@functools.cache
def queries() -> dict[str, str]:
    """``{name: sql}`` for every statement of every file (:func:`files`), fragments expanded,
    without its leading comment lines (so each text starts with its verb: ``SELECT``, ``WITH``,
    ``UPDATE``, …)."""
    frags = fragments()
    out: dict[str, str] = {}
    for f in files():
        for what, name, _params, body in _parse(f.read_text(), f.name):
            if what != "name":
                continue
            if name in out:
                raise ValueError(f"query {name!r} is defined twice")
            out[name] = _expand(body, frags, f"{f.name}: {name}")
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
