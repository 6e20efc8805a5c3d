"""The platform's Proxmox identity hidden from tenants, *where z9 writes it* — never by pattern on
the whole answer.

z9 writes what Proxmox said into a few fields only: a job's ``steps`` (their ``detail``: UPIDs,
which carry the platform's ``user@realm!token``), a job's ``error`` (Proxmox's own error text) and
a resource's ``status_reason`` (a job error copied). Only the strings inside those fields are
redacted for a token without ``operator``: the user of every UPID, and the configured regions'
token ids and users as whole words, become ``hidden``. A tenant's own fields — names, labels,
SSH keys, target names, anything it sent — are never rewritten, so ``root@pam!zz`` in a label
comes back as it was sent (no oracle: what a tenant writes says nothing about what z9 hides).
The API's own error answers (``{"error": {"code", …}}`` at the top) are about the request and are
not rewritten either.
"""
from __future__ import annotations

import json
import re
from typing import Any

#: the fields z9 fills with what Proxmox answered
PLATFORM_FIELDS = frozenset({"steps", "error", "status_reason"})

# UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:  — the user (user@realm!tokenid)
_UPID_USER = re.compile(r"(UPID:[^:\"\s]*:[0-9A-Fa-f]{8}:[0-9A-Fa-f]{8,9}:[0-9A-Fa-f]{8}:[^:\"\s]*:[^:\"\s]*:)"
                        r"([^:\"\s]+)(:)")


def _names_re(users: tuple[bytes, ...]) -> re.Pattern[str] | None:
    names = sorted({u.decode() for u in users if u}, key=len, reverse=True)
    if not names:
        return None
    # whole words only: `root@pam` inside `root@pam!zz` (another account) is left alone
    return re.compile(r"(?<![\w@.!-])(?:" + "|".join(re.escape(n) for n in names) + r")(?![\w@.!-])")


def _redact_text(text: str, names: re.Pattern[str] | None) -> str:
    out = _UPID_USER.sub(r"\1hidden\3", text)
    return names.sub("hidden", out) if names is not None else out


def _walk(value: Any, names: re.Pattern[str] | None) -> Any:
    if isinstance(value, str):
        return _redact_text(value, names)
    if isinstance(value, list):
        return [_walk(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _walk(v, names) for k, v in value.items()}
    return value


def _visit(value: Any, names: re.Pattern[str] | None, top: bool) -> Any:
    if isinstance(value, list):
        return [_visit(v, names, False) for v in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for k, v in value.items():
        if k in PLATFORM_FIELDS and not (top and k == "error" and isinstance(v, dict) and "code" in v):
            out[k] = _walk(v, names)
        else:
            out[k] = _visit(v, names, False)
    return out


def redact(body: bytes, users: tuple[bytes, ...]) -> bytes:
    """``body`` (a JSON answer) with the platform's identity hidden in the fields z9 writes from
    Proxmox (the same object when there was nothing to hide, or the body is not JSON)."""
    if b"@" not in body and b"UPID:" not in body:
        return body
    try:
        doc = json.loads(body)
    except ValueError:
        return body
    names = _names_re(users)
    out = _visit(doc, names, True)
    return body if out == doc else json.dumps(out).encode()
