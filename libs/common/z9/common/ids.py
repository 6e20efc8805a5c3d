"""Resource and job identifiers: ``<prefix>_<26 lower-case Crockford base32 chars>``.

The first 48 bits are the Unix time in milliseconds, the remaining 80 are random (ULID layout),
so ids sort by creation time and are valid inside a Proxmox tag (``[a-z0-9_][a-z0-9_+.-]*``).
"""
from __future__ import annotations

import re
import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
GENERIC_PREFIXES = ("apl", "job", "ten", "tok")
"""The prefixes of what is no resource type (address pools, jobs, tenants, tokens); each resource
type brings its own (:func:`prefixes`)."""
_ID_RE = re.compile(r"([a-z][a-z0-9]{1,3})_[0-9a-hjkmnp-tv-z]{26}")


def prefixes() -> tuple[str, ...]:
    """Every id prefix: the resource types' (from the registry, :mod:`z9.resources`), then the
    generic ones."""
    from z9 import resources  # the registry imports this module
    return (*resources.prefixes(), *GENERIC_PREFIXES)


def id_pattern(*prefixes: str) -> str:
    """The JSON Schema ``pattern`` of an id of one of ``prefixes`` (what :func:`is_id` accepts)."""
    return rf"^({'|'.join(prefixes)})_[0-9a-hjkmnp-tv-z]{{26}}$"


def new_id(prefix: str, *, now_ms: int | None = None) -> str:
    """Return a fresh id such as ``srv_01jd…``; ``prefix`` must be one of :func:`prefixes`."""
    if prefix not in GENERIC_PREFIXES and prefix not in prefixes():
        raise ValueError(f"unknown id prefix {prefix!r}")
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    n = (ms & ((1 << 48) - 1)) << 80 | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[n & 31])
        n >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def is_id(value: str, prefix: str | None = None) -> bool:
    """True when ``value`` is a well-formed id (of ``prefix`` when given)."""
    m = _ID_RE.fullmatch(value or "")
    if not m or m.group(1) not in prefixes():
        return False
    return prefix is None or m.group(1) == prefix
