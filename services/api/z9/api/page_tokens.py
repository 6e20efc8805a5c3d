"""Opaque job page tokens: ``next_after`` says where the next page starts without saying how many
jobs the platform holds.

A page carries the last job's position (``jobs.seq``, a platform-wide sequence: in clear — the
former ``pg_<base36 seq>`` — it counted every tenant's jobs). The token is that position and a
64-bit tag (HMAC-SHA256 over the tenant and the position) in one AES-256 block, base64url:
``pg_`` + 22 characters. Only the API can make one, a token decodes only for the tenant it was
made for, and two pages' tokens show nothing of the distance between them. The keys are derived
from the installation key (``Z9_INSTALLATION_KEY``), so every API process reads every other's
tokens; without one, a key made at start serves this process only (a token from another process
or an earlier run then answers 422 and the listing starts over).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import struct
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from z9.common import pki

PATTERN = r"^pg_[A-Za-z0-9_-]{22}$"
_TOKEN = re.compile(PATTERN)
SEQ_MAX = 2**63 - 1  # jobs.seq is a bigint


class PageKeys:
    def __init__(self, secret: bytes):
        self._aes = hmac.new(secret, b"z9 job page tokens: cipher", hashlib.sha256).digest()
        self._mac = hmac.new(secret, b"z9 job page tokens: tag", hashlib.sha256).digest()

    @classmethod
    def from_settings(cls, settings: Any) -> "PageKeys":
        key = settings.installation_key
        if key is not None:
            try:
                return cls(pki.InstallationKey.parse(key.get_secret_value()).raw)
            except pki.SealError:
                pass  # a malformed key: clusters answer 503 naming it; pages still work in this process
        return cls(os.urandom(32))

    def _tag(self, tenant_id: str, seq: int) -> bytes:
        return hmac.new(self._mac, tenant_id.encode() + b"\0" + struct.pack(">Q", seq), hashlib.sha256).digest()[:8]

    def _cipher(self) -> Cipher:
        return Cipher(algorithms.AES(self._aes), modes.ECB())  # one block: a keyed permutation, no pattern to leak

    def encode(self, tenant_id: str, seq: int) -> str:
        block = struct.pack(">Q", seq) + self._tag(tenant_id, seq)
        enc = self._cipher().encryptor()
        out = enc.update(block) + enc.finalize()
        return "pg_" + base64.urlsafe_b64encode(out).decode().rstrip("=")

    def decode(self, tenant_id: str, text: str) -> int | None:
        """The position of ``tenant_id``'s page token; None when ``text`` is not one (not of the
        form, made with another key, for another tenant, or altered)."""
        if not _TOKEN.fullmatch(text):
            return None
        try:
            raw = base64.urlsafe_b64decode(text[3:] + "==")
        except (binascii.Error, ValueError):
            return None
        dec = self._cipher().decryptor()
        block = dec.update(raw) + dec.finalize()
        seq = struct.unpack(">Q", block[:8])[0]
        if not hmac.compare_digest(block[8:], self._tag(tenant_id, seq)):
            return None
        return min(seq, SEQ_MAX)


PAGE_KEYS = web.AppKey("page_keys", PageKeys)
