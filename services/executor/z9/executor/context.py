"""What a running job sees: its row, its lease, the region's hypervisor client, and fenced
ways to report progress.

Lease and heartbeat (architecture §2, §4). A claim gives the worker the lease
``(job id, lease_owner, attempt)`` valid for ``lease_ttl_s`` seconds. Every write the worker
makes — step progress, memo, heartbeat, finish — is fenced by that triple and by
``status = 'running'``; a write matching no row raises :class:`LeaseLost` and the worker drops
the job at once. The lease is renewed by every progress write and, while a step waits on the
hypervisor, by a heartbeat every ``heartbeat_s`` seconds — but only while the job keeps making
progress (an answer from the hypervisor about the job's task counts): once nothing has
progressed for ``step_timeout_s`` seconds the executor cancels the job, the lease expires and
the scheduler hands the job to another worker. Right before each mutating hypervisor call a
job calls :meth:`JobContext.fence`, a fenced renewal, so a worker that lost its lease sends
nothing more to the hypervisor. Every renewal also moves the attempt's local deadline
(:attr:`JobContext.deadline`, :mod:`z9.executor.lease_deadline`): past it, the region's client
sends nothing for the job, whether or not a fenced write has noticed the loss yet.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import asyncpg

from z9.common import store, tracing
from z9 import resources
from z9.common.clock import SYSTEM, Clock
from z9.common.errors import Cancelled, PermanentError
from z9.common.models import Job, utc_now_iso
from z9.common.settings import Settings
from z9.common.store import Lease

from .batching import succeed_one
from .lease_deadline import LeaseDeadline
from .proxmox import ProxmoxClient, Upid


@dataclass(frozen=True)
class Drift:
    """One difference a plan found between the resource's intent and the world: ``path`` (what:
    ``config.cores``, ``firewall.policy_in``, ``power``…), ``want`` (the intent), ``have`` (the world;
    None: absent). The step that fixes it carries it (:attr:`Step.drift`): the plan's own reading of
    the world, which ``POST …/actions/plan`` answers as it is."""

    path: str
    want: Any
    have: Any

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "want": self.want, "have": self.have}


@dataclass
class Step:
    """One planned step: ``name`` (a verb such as ``clone``), ``detail`` (free-form, e.g. the
    UPID being waited on) and ``state`` pending|running|done|failed|skipped. ``kind``: the
    :class:`StepKind` it was planned as — what runs it (None for a step built by name only).

    What a plan says about the step for a preview (``POST …/actions/plan``), none of it stored in
    the job's row: ``drift``, the differences it fixes; ``why``, a sentence; ``disruptive``, whether
    it stops, reboots, hot-unplugs or re-addresses a guest (None: its kind's
    :attr:`StepKind.disruptive`)."""

    name: str
    detail: dict[str, Any] = field(default_factory=dict)
    state: str = "pending"
    started_at: str | None = None
    finished_at: str | None = None
    kind: "StepKind | None" = field(default=None, compare=False, repr=False)
    drift: list[Drift] = field(default_factory=list, compare=False, repr=False)
    why: str = field(default="", compare=False, repr=False)
    disruptive: bool | None = field(default=None, compare=False, repr=False)

    @property
    def interrupts(self) -> bool:
        """The step stops, reboots, hot-unplugs or re-addresses a guest (as planned, else as its kind is)."""
        if self.disruptive is not None:
            return self.disruptive
        return self.kind.disruptive if self.kind is not None else False

    def explained(self, why: str = "", drift: list[Drift] | tuple[Drift, ...] = (),
                  disruptive: bool | None = None) -> Step:
        """The step with what a preview says about it (returns it: ``plan`` code chains it)."""
        self.why = why or self.why
        self.drift = [*self.drift, *drift]
        if disruptive is not None:
            self.disruptive = disruptive
        return self

    def preview(self) -> dict[str, Any]:
        """The step as ``POST …/actions/plan`` answers it."""
        why = self.why or "; ".join(f"{d.path}: {d.have!r} → {d.want!r}" for d in self.drift)
        return {"name": self.name, "member": self.member, "disruptive": self.interrupts,
                "why": why or (self.kind.why if self.kind is not None else "") or self.name}

    @property
    def member(self) -> str | None:
        """The member of a multi-VM resource the step acts on (``lb-1``, ``cp-0``), from its
        ``detail`` (where plans put it); None for a step of the resource as a whole."""
        m = self.detail.get("member")
        return m if isinstance(m, str) else None

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "member": self.member, "state": self.state, "started_at": self.started_at,
                "finished_at": self.finished_at, "detail": self.detail}


@dataclass(frozen=True)
class StepKind:
    """A kind of step as a value: its ``name`` (what a job's steps show) bound to ``run``, the
    coroutine that performs it. A plan makes its steps from these (:meth:`step`); an apply runs
    ``step.kind.run(…)`` (through :class:`StepKinds`) instead of matching names in an ``if``
    chain. Each family of steps (a VM member's, a removal's…) fixes the arguments ``run`` takes."""

    name: str
    run: Callable[..., Awaitable[None]]
    # what a preview says of such a step when its plan says nothing more: whether it stops, reboots,
    # hot-unplugs or re-addresses a guest, and why it is done
    disruptive: bool = False
    why: str = ""

    def step(self, detail: dict[str, Any] | None = None) -> Step:
        return Step(self.name, dict(detail or {}), kind=self)


class StepKinds:
    """A family of step kinds: what runs a step, from the step itself (or, for a step built by
    name only, from its name); an unknown one is a permanent error."""

    def __init__(self, *kinds: StepKind):
        self.by_name = {k.name: k for k in kinds}
        if len(self.by_name) != len(kinds):
            raise ValueError("two step kinds share a name")

    def find(self, step: Step) -> StepKind | None:
        """The step's kind when it is of this family, else None (a job whose plan mixes families:
        its own steps and the VM machinery's)."""
        kind = step.kind if step.kind is not None else self.by_name.get(step.name)
        return kind if kind is not None and self.by_name.get(kind.name) is kind else None

    def of(self, step: Step, job_kind: str = "") -> StepKind:
        kind = step.kind if step.kind is not None else self.by_name.get(step.name)
        if kind is None or self.by_name.get(kind.name) is not kind:
            raise PermanentError(f"{job_kind}: unknown step {step.name!r}")
        return kind


class JobContext:
    """Per-attempt handle given to a job kind's observe/apply/verify.

    ``pool`` is the executor's asyncpg pool, ``pve`` the region's :class:`ProxmoxClient`,
    ``clock`` the executor's (every time the job decides by: :mod:`z9.common.clock`).
    """

    def __init__(self, job: Job, owner: str, pool: asyncpg.Pool, pve: ProxmoxClient, settings: Settings,
                 finisher: Any = None, clock: Clock = SYSTEM):
        self.job = job
        self.finisher = finisher  # the executor's FinishBatcher; None: finish on its own
        self.lease = Lease(job.id, owner, job.attempt)
        # the lease's local deadline: no Proxmox call for this attempt after it (lease_deadline.py)
        self.deadline = LeaseDeadline(job.id, job.attempt, owner, ttl_s=settings.lease_ttl_s,
                                      margin_s=settings.lease_safety_margin_s, clock=clock,
                                      expires_at=job.lease_expires_at)
        self.pool = pool
        self.pve = pve
        self.settings = settings
        self.clock = clock
        self.steps: list[Step] = []
        self.memo: dict[str, Any] = dict(job.memo)
        self.last_progress = clock.monotonic()
        self.claimed_at = time.monotonic()  # of the claim: the attempt's real duration (a metric)
        self.finished = False  # set before the final write: the heartbeat leaves the job alone
        # ... except while its success finish is being retried after a lock wait (batching.py):
        # the job is done but not recorded, so it is still running and its lease is renewed.
        self.flushing = False

    #: a preview's context (z9.executor.preview.PlanContext): observe reads, nothing is written
    read_only = False

    @property
    def args(self) -> dict[str, Any]:
        return self.job.args

    def steps_json(self) -> list[dict[str, Any]]:
        """The step list as stored in the job row."""
        return [s.as_json() for s in self.steps]

    def touch(self) -> None:
        """Mark in-memory progress (the heartbeat renews the lease while this is recent)."""
        self.last_progress = self.clock.monotonic()

    async def on_poll(self) -> None:
        """Called by the task waiter when the node answered that the task still runs."""
        self.touch()

    async def fence(self) -> None:
        """A fenced lease renewal right before a mutating hypervisor call: raises LeaseLost when
        the job is no longer ours, so a worker that lost its lease sends nothing more."""
        self.touch()
        sent_at = self.clock.monotonic()
        await store.job_heartbeat(self.pool, self.lease, self.settings.lease_ttl_s, now=self.clock.db_now())
        self.deadline.renewed(sent_at)

    async def _write_steps(self) -> None:
        self.touch()
        sent_at = self.clock.monotonic()
        await store.job_progress(self.pool, self.lease, self.steps_json(), self.settings.lease_ttl_s,
                                 now=self.clock.db_now())
        self.deadline.renewed(sent_at)

    async def check_superseded(self) -> None:
        """Raise :class:`Cancelled` when a later job of this job's resource supersedes it (its
        type's rule, :meth:`ResourceType.superseded_by`: an immediate deletion ends a create
        under way). Called before observe and between steps: a step under way finishes (its
        task recorded), nothing new starts."""
        rtype = resources.get(self.job.resource_type)
        kinds = rtype.superseded_by(self.job.kind) if rtype is not None else ()
        if not kinds or self.job.resource_id is None:
            return
        found = await store.job_superseding(self.pool, self.job.id, list(kinds))
        if found is not None:
            raise Cancelled(f"cancelled: {rtype.name} {self.job.resource_id} is being deleted by {found[1]} job "
                            f"{found[0]}", by_job=found[0])

    async def set_plan(self, steps: list[Step]) -> None:
        """Replace the job's step list with this attempt's plan (fenced). An empty plan over an
        empty stored list writes nothing: the row already says it, and the finish that follows
        at once is fenced."""
        self.steps = steps
        if not steps and not self.job.steps:
            self.touch()
            return
        await self._write_steps()

    async def succeed(self, kind: Any, observed: Any) -> None:
        """Finish the job as ``succeeded`` and ``kind.record`` what verify ``observed``, in one
        transaction — shared with other jobs' finishes when the executor batches them
        (:mod:`z9.executor.batching`). Raises LeaseLost (this job's row no longer matches its
        lease), the database's connection errors, or what ``record`` raised (rolled back)."""
        if self.finisher is not None:
            await self.finisher.succeed(self, kind, observed)
        else:
            await succeed_one(self.pool, self, kind, observed)

    async def step_running(self, step: Step) -> None:
        """Mark ``step`` running (fenced write). Raises LeaseLost."""
        step.state, step.started_at = "running", utc_now_iso()
        await self._write_steps()

    async def step_detail(self, step: Step, **detail: Any) -> None:
        """Record details (the UPID being waited on, the vmid chosen) before waiting."""
        step.detail.update(detail)
        await self._write_steps()

    async def step_done(self, step: Step, state: str = "done") -> None:
        """Mark ``step`` done (or ``state``), fenced. Raises LeaseLost."""
        step.state, step.finished_at = state, utc_now_iso()
        await self._write_steps()

    def mark_running_step_failed(self) -> None:
        """In memory: the step that was running when the attempt ended is ``failed``."""
        for s in self.steps:
            if s.state == "running":
                s.state, s.finished_at = "failed", utc_now_iso()

    async def remember(self, **facts: Any) -> None:
        """Persist facts about what this job told the world (kept across attempts), fenced."""
        self.memo.update(facts)
        self.touch()
        sent_at = self.clock.monotonic()
        await store.job_remember(self.pool, self.lease, facts, self.settings.lease_ttl_s, now=self.clock.db_now())
        self.deadline.renewed(sent_at)

    async def wait_task(self, step: Step, upid: str) -> str:
        """Record ``upid`` in ``step`` and wait for the task to stop (see ProxmoxClient.wait_task)."""
        await self.step_detail(step, upid=upid)
        up = Upid.parse(upid)
        with tracing.span(f"wait {up.type}", {"pve.task.type": up.type, "pve.node": up.node, "pve.upid": upid}) as span:
            exitstatus = await self.pve.wait_task(upid, deadline_s=self.settings.task_deadline_s,
                                                  poll_s=self.settings.task_poll_s, on_poll=self.on_poll)
            span.set_attribute("pve.task.exitstatus", exitstatus)
        return exitstatus
