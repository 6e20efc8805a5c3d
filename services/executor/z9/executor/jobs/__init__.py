"""Job kinds: one module per kind, each with ``observe``, ``plan`` (pure), ``apply``, ``verify``
together, plus ``record`` (write what verify saw, in the transaction that finishes the job) and
``record_failure(conn, ctx, error)`` (the resource carries a failed job's reason; ``error`` is
the job row's error, ``{class, message, …}``). A kind whose ``record`` writes nothing may say
``RECORDS_NOTHING = True``: its finish and the executor's next claim are then one statement
(services/executor/z9/executor/batching.py); no product kind does today.

:data:`REGISTRY` maps the ``kind`` column to its module; :func:`register` adds one (benchmarks
register a no-op kind this way).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from z9.common import kinds
from z9.common.errors import PermanentError

from . import (address_assign, address_create, address_delete, address_unassign, cluster_create, cluster_delete,
               cluster_observe, cluster_reconcile, lb_configure, lb_create, lb_delete, lb_observe, lb_start, lb_stop, server_create,
               server_delete, server_reboot, server_resize, server_start, server_stop, volume)

REGISTRY: dict[str, Any] = {}


def register(module: ModuleType | Any) -> None:
    """Register a job kind: anything with KIND, observe, plan, apply, verify, record,
    record_failure."""
    for attr in ("KIND", "observe", "plan", "apply", "verify", "record", "record_failure"):
        if not hasattr(module, attr):
            raise TypeError(f"job kind {module!r} lacks {attr}")
    REGISTRY[module.KIND] = module
    kinds.add(module.KIND)


for _m in (server_create, server_stop, server_start, server_reboot, server_resize, server_delete, address_create,
           address_assign, address_unassign, address_delete, lb_create, lb_configure, lb_start, lb_stop, lb_delete,
           lb_observe, cluster_create, cluster_reconcile, cluster_delete, cluster_observe, *volume.KINDS):
    register(_m)


class UnknownKind:
    """Stands in for a ``kind`` no module handles: the job fails permanently, saying so."""

    def __init__(self, kind: str):
        self.KIND = kind

    async def observe(self, ctx: Any) -> None:
        raise PermanentError(f"unknown job kind {self.KIND!r}: no executor module handles it")

    async def record_failure(self, conn: Any, ctx: Any, error: dict[str, Any]) -> None:
        return None
