"""Resource and job identifiers: ``<prefix>_<26 lower-case Crockford base32 chars>``.

The first 48 bits are the Unix time in milliseconds, the remaining 80 are random (ULID layout),
so ids sort by creation time and are valid inside a Proxmox tag (``[a-z0-9_][a-z0-9_+.-]*``).
"""
from __future__ import annotations

import re
import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
PREFIXES = ("srv", "adr", "apl", "k8s", "lb", "job", "ten", "tok", "vol")
ID_RE = re.compile(r"(srv|adr|apl|k8s|lb|job|ten|tok|vol)_[0-9a-hjkmnp-tv-z]{26}")


def id_pattern(*prefixes: str) -> str:
    """The JSON Schema ``pattern`` of an id of one of ``prefixes`` (what :func:`is_id` accepts)."""
    return rf"^({'|'.join(prefixes)})_[0-9a-hjkmnp-tv-z]{{26}}$"


def new_id(prefix: str, *, now_ms: int | None = None) -> str:
    """Return a fresh id such as ``srv_01jd…``; ``prefix`` must be one of :data:`PREFIXES`."""
    if prefix not in PREFIXES:
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
    if not ID_RE.fullmatch(value or ""):
        return False
    return prefix is None or value.startswith(prefix + "_")
