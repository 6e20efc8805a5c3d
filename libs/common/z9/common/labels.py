"""Label selectors (``GET /v1/<plural>?label_selector=``): the Kubernetes syntax's subset
``k=v`` (or ``k==v``), ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, comma-separated, all required.

:func:`parse` gives a :class:`Selector` (ValueError with a message naming the requirement);
:meth:`Selector.params` its five SQL parameters, applied by the list queries' shared fragment::

    AND labels @> $eq                                  -- k=v (all at once)
    AND NOT (labels @> ANY($ne))                       -- k!=v (also true without k, as Kubernetes)
    AND labels ?& $exists                              -- k
    AND NOT (labels ?| $absent)                        -- !k
    AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements($in) r
                    WHERE NOT coalesce((r->'v') ? (labels->>(r->>'k')), false))   -- k in (…)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

KEY = re.compile(r"([a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
# What :func:`parse` accepts, as one regular expression (the OpenAPI document's ``pattern`` of
# ``label_selector``; tests/integration/api/test_filters.py checks the two agree)
_V1 = r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?"
# The space allowed around the parts: ASCII's six, spelt out. ``\s`` is another set in each
# dialect (ECMA-262 adds U+FEFF, Rust's engine U+0085, Python's ``str.strip`` U+001C-U+001F), so
# the document and the parser would disagree on the edges.
SPACE = " \t\n\r\f\v"
_S = r"[ \t\n\r\f\v]"
_REQ = (rf"({KEY.pattern}{_S}+in{_S}+\({_S}*({_V1}({_S}*,{_S}*{VALUE.pattern})*|{VALUE.pattern}({_S}*,{_S}*{VALUE.pattern})+){_S}*\)"
        rf"|{KEY.pattern}{_S}*(!=|==?){_S}*{VALUE.pattern}|!{_S}*{KEY.pattern}|{KEY.pattern})")
SELECTOR_PATTERN = rf"^{_S}*{_REQ}{_S}*(,{_S}*{_REQ}{_S}*)*$"
_IN = re.compile(rf"(?P<key>[^ \t\n\r\f\v!=(),]+){_S}+in{_S}+\((?P<values>[^()]*)\)")
_NOTIN = re.compile(rf"[^ \t\n\r\f\v!=(),]+{_S}+notin{_S}+\(")


@dataclass
class Selector:
    eq: dict[str, str] = field(default_factory=dict)
    ne: list[dict[str, str]] = field(default_factory=list)
    exists: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)
    in_: list[dict[str, Any]] = field(default_factory=list)

    def params(self) -> tuple[Any, ...]:
        """The five query parameters (jsonb values as Python objects: the pools' codec encodes them)."""
        return (dict(self.eq), [dict(n) for n in self.ne], list(self.exists), list(self.absent), list(self.in_))

    def matches(self, labels: dict[str, str]) -> bool:
        """The same rule in Python (tests, clients)."""
        return (all(labels.get(k) == v for k, v in self.eq.items())
                and all(labels.get(k) != v for n in self.ne for k, v in n.items())
                and all(k in labels for k in self.exists) and not any(k in labels for k in self.absent)
                and all(labels.get(r["k"]) in r["v"] for r in self.in_))


EMPTY_PARAMS = Selector().params()


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ')'")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError("unbalanced '('")
    parts.append(cur)
    return [p.strip(SPACE) for p in parts]


def _key(k: str, req: str) -> str:
    if not KEY.fullmatch(k) or len(k) > 127:
        raise ValueError(f"{req!r}: {k!r} is not a label key")
    return k


def _value(v: str, req: str) -> str:
    if not VALUE.fullmatch(v):
        raise ValueError(f"{req!r}: {v!r} is not a label value")
    return v


def parse(text: str) -> Selector:
    """The selector ``text``; ValueError naming the requirement it cannot read."""
    if len(text) > 4096:
        raise ValueError("longer than 4096 characters")
    sel = Selector()
    for req in _split(text):
        if not req:
            raise ValueError("an empty requirement (two commas, or a trailing comma)")
        if m := _IN.fullmatch(req):
            values = [v.strip(SPACE) for v in m.group("values").split(",")]
            if not values or values == [""]:
                raise ValueError(f"{req!r}: 'in' needs at least one value")
            sel.in_.append({"k": _key(m.group("key"), req), "v": [_value(v, req) for v in values]})
        elif _NOTIN.match(req):
            raise ValueError(f"{req!r}: 'notin' is not supported (use k!=v for each value)")
        elif "!=" in req:
            k, v = (s.strip(SPACE) for s in req.split("!=", 1))
            sel.ne.append({_key(k, req): _value(v, req)})
        elif "==" in req or "=" in req:
            k, v = (s.strip(SPACE) for s in req.split("==" if "==" in req else "=", 1))
            k, v = _key(k, req), _value(v, req)
            if k in sel.eq and sel.eq[k] != v:
                sel.eq[k] = v
                sel.in_.append({"k": k, "v": []})  # k=a,k=b: nothing matches
            sel.eq[k] = v
        elif req.startswith("!"):
            sel.absent.append(_key(req[1:].strip(SPACE), req))
        else:
            sel.exists.append(_key(req, req))
    return sel
