"""Job kinds: one module per kind (in its resource type's slice), each with ``observe``, ``plan`` (pure), ``apply``, ``verify``
together, plus ``record`` (write what verify saw, in the transaction that finishes the job) and
``record_failure(conn, ctx, error)`` (the resource carries a failed job's reason; ``error`` is
the job row's error, ``{class, message, …}``). A kind whose ``record`` writes nothing may say
``RECORDS_NOTHING = True``: its finish and the executor's next claim are then one statement
(services/executor/z9/executor/batching.py); no product kind does today.

:data:`REGISTRY` maps the ``kind`` column to its module: every module that sets ``KIND`` in a
resource type's ``jobs`` package (``resources/z9/resources/<type>/jobs/``), found through the
type registry (:mod:`z9.resources`), named in no list here; :func:`register` adds one more
(benchmarks register a no-op kind this way).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from z9.common import kinds
from z9.common.errors import PermanentError

from z9 import resources

REGISTRY: dict[str, Any] = {}


def register(module: ModuleType | Any) -> None:
    """Register a job kind: anything with KIND, observe, plan, apply, verify, record,
    record_failure."""
    for attr in ("KIND", "observe", "plan", "apply", "verify", "record", "record_failure"):
        if not hasattr(module, attr):
            raise TypeError(f"job kind {module!r} lacks {attr}")
    REGISTRY[module.KIND] = module
    kinds.add(module.KIND)


for _type in resources.types():  # every kind of every slice (resources/z9/resources/<type>/jobs)
    for _m in resources.job_modules(_type):
        register(_m)
    _missing = set(_type.kinds) - set(REGISTRY)
    if _missing:
        raise TypeError(f"resource type {_type.name} names kinds its jobs package lacks: {sorted(_missing)}")


class UnknownKind:
    """Stands in for a ``kind`` no module handles: the job fails permanently, saying so."""

    def __init__(self, kind: str):
        self.KIND = kind

    async def observe(self, ctx: Any) -> None:
        raise PermanentError(f"unknown job kind {self.KIND!r}: no executor module handles it")

    async def record_failure(self, conn: Any, ctx: Any, error: dict[str, Any]) -> None:
        return None
