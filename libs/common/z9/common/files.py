"""Files that hold a secret: written 0600 from their first byte (never world-readable, not even
between a write and a chmod), whole (a temporary file in the same folder, then renamed)."""
from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path | str, data: str | bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 (owner read/write only), atomically."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing tmp file of another mode, or a umask that drops bits
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.replace(tmp, path)
