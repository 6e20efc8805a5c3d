"""ClusterDelete: the immediate deletion of a Kubernetes cluster (no buffer, no cancel).

observe  every VM carrying ``z9-id-<cluster>`` (every member), untagged clones of ours, the VMs
         the row last recorded (suspects), and the cluster's bootstrap ISOs left on storage
         (``z9-<cluster>-…``). A cluster not ``destroying`` means this job was superseded.
plan     (pure) the deletion guard on every VM found — a VM with a platform role carrying the
         cluster's tag is refused, unconditionally (the job fails, the cluster ``failed`` with the
         reason) — then stop/destroy per VM, then ``delete_iso`` per leftover ISO.
apply    the VM machinery's removal steps (guard and lock re-checked right before each destroy).
verify   no VM carries the tag, no untagged clone of ours is left, no ISO of ours is on storage.
record   in the finishing transaction: ``deleted``, the keys destroyed (``cluster_keys`` row
         gone), the endpoint address released (its IP quarantined), the members cleared.

Enqueued by DELETE at once: a live ClusterCreate/ClusterReconcile of the cluster is superseded
between its steps (:meth:`ResourceType.superseded_by`), so this job does not wait behind it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from z9.common.errors import TemporaryError
from z9.common.models import Job
from z9.resources.cluster import CLUSTER

from z9.executor import vms
from z9.executor.context import JobContext, Step, StepKind, StepKinds
from z9.resources.cluster.jobs import shared as _cluster
from z9.resources.cluster import store as cluster_store
from z9.resources.cluster import CLUSTER_DELETE

KIND = CLUSTER_DELETE


@dataclass
class World:
    removal: vms.Removal
    isos: list[tuple[str, str]] = field(default_factory=list)  # (node, volid)


async def observe(ctx: JobContext) -> World:
    cluster = await CLUSTER.get(ctx.pool, ctx.job.resource_id)
    if cluster is None or cluster.status != "destroying":
        return World(removal=vms.Removal(superseded=cluster.status if cluster else "gone"))
    recorded = [(int(m["vmid"]), str(m["node"])) for m in cluster.members if m.get("vmid") is not None]
    removal = await vms.observe_removal(ctx, cluster.id, recorded)
    return World(removal=removal, isos=await _cluster.cluster_isos(ctx, cluster.id))


def plan(job: Job, world: World) -> list[Step]:
    """Pure: the guard on every VM (GuardRefusal), stop/destroy per VM, then the ISOs."""
    steps = vms.plan_removal(job.resource_id, world.removal)
    if world.removal.superseded:
        return []
    return steps + [DELETE_ISO.step({"node": n, "volid": v}) for n, v in world.isos]


async def _delete_iso(ctx: JobContext, step: Step) -> None:
    await _cluster.delete_iso(ctx, step.detail["node"], step.detail["volid"], step)


#: the delete's own step (run(ctx, step)); its stop/destroy steps are the VM machinery's removal
DELETE_ISO = StepKind("delete_iso", _delete_iso)
STEPS = StepKinds(DELETE_ISO)


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    kind = STEPS.find(step)
    if kind is not None:
        await kind.run(ctx, step)
    else:
        await vms.apply_removal_step(ctx, ctx.job.resource_id, step)


async def verify(ctx: JobContext) -> None:
    cluster = await CLUSTER.get(ctx.pool, ctx.job.resource_id)
    if cluster is None or cluster.status != "destroying":
        return None
    await vms.verify_removed(ctx, cluster.id)
    left = await _cluster.cluster_isos(ctx, cluster.id)
    if left:
        raise TemporaryError("verify: bootstrap ISOs still on storage: " + ", ".join(v for _, v in left))


async def record(conn: Any, ctx: JobContext, _: None) -> None:
    """``deleted``; keys destroyed and endpoint released in this same transaction."""
    if await CLUSTER.deleted(conn, ctx.job.resource_id):
        await cluster_store.cluster_keys_destroy(conn, ctx.job.resource_id)
        await cluster_store.cluster_endpoint_release(conn, ctx.job.resource_id)
        await cluster_store.cluster_members(conn, ctx.job.resource_id, [], False)


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    await CLUSTER.mark_failed_by_job(conn, ctx.job.resource_id, error["message"], kind=ctx.job.kind,
                                     refused=bool(error.get("refused")))
