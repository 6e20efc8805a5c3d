"""Job kinds: one module per kind (in its resource type's slice; or one reconciler under several
names, listed in a module's ``JOB_KINDS``), each a
:class:`~z9.executor.kind.JobKind` — ``observe``, ``plan`` (pure), ``apply``, ``verify`` together,
plus ``record`` (write what verify saw, in the transaction that finishes the job) and
``record_failure(conn, ctx, error)`` (the resource carries a failed job's reason; ``error`` is
the job row's error, ``{class, message, …}``). A kind whose ``record`` writes nothing may say
``RECORDS_NOTHING = True``: its finish and the executor's next claim are then one statement
(services/executor/z9/executor/batching.py); no product kind does today.

:data:`REGISTRY` maps the ``kind`` column to its kind: every module that sets ``KIND`` (and every
kind a module lists in ``JOB_KINDS``) in a
resource type's ``jobs`` package (``resources/z9/resources/<type>/jobs/``), found through the
type registry (:mod:`z9.resources`), named in no list here; :func:`register` adds one more
(benchmarks register a no-op kind this way).
"""
from __future__ import annotations

from typing import Any

from z9 import resources
from z9.common import kinds
from z9.common.errors import PermanentError
from z9.common.models import Job

from ..context import JobContext, Step
from ..kind import PHASES, JobKind

REGISTRY: dict[str, JobKind] = {}


def register(module: JobKind) -> None:
    """Register a job kind (the type checker holds it to :class:`JobKind`; at run time a kind
    lacking a phase is refused here, naming it)."""
    for attr in ("KIND", *PHASES):
        if not hasattr(module, attr):
            raise TypeError(f"job kind {module!r} lacks {attr}")
    REGISTRY[module.KIND] = module
    kinds.add(module.KIND)


for _type in resources.types():  # every kind of every slice (resources/z9/resources/<type>/jobs)
    for _m in resources.job_modules(_type):
        register(_m)  # type: ignore[arg-type]  # a module, checked against JobKind by tests/unit/test_kind_contract.py
    _missing = set(_type.kinds) - set(REGISTRY)
    if _missing:
        raise TypeError(f"resource type {_type.name} names kinds its jobs package lacks: {sorted(_missing)}")


class UnknownKind:
    """Stands in for a ``kind`` no module handles: the job fails permanently, saying so."""

    def __init__(self, kind: str):
        self.KIND = kind

    async def observe(self, ctx: JobContext, /) -> None:
        raise PermanentError(f"unknown job kind {self.KIND!r}: no executor module handles it")

    def plan(self, job: Job, world: Any, /) -> list[Step]:
        return []  # never reached: observe refuses

    async def apply(self, ctx: JobContext, world: Any, step: Step, /) -> None:
        return None

    async def verify(self, ctx: JobContext, /) -> None:
        return None

    async def record(self, conn: Any, ctx: JobContext, observed: Any, /) -> None:
        return None

    async def record_failure(self, conn: Any, ctx: JobContext, error: dict[str, Any], /) -> None:
        return None
