"""SdnApply: a region's one SDN apply — every pending edit of z9's in one ``PUT /cluster/sdn``.

PVE's apply commits *everyone's* pending SDN edits and reloads every node (pve-network
``API2/Network/SDN.pm`` reload); serial applies fail on its lock (community.proxmox #440: ``invalid lock
token provided!``). So z9 makes one apply job per region at a time (resource ``sdn:<region>``), queued by
the first network edit that finds none queued (``ensure_apply``, under the region's SDN row lock) and
started after ``sdn_apply_batch_s``: the edits of that window go out together (20 networks created at
once: at most two applies).

observe  the batch window (a Snooze until it has passed), then — in one transaction under the
         region's SDN row lock — the apply is taken (the next edit queues the next apply) and the
         networks of the region read: the VNets wanted (every network not ``destroying``/``deleted``)
         and those that must go. The SDN as PVE has it: pending and running VNets, z9's zone, each
         node's view of the zone, and the lock token z9 last recorded.
plan     (pure) [] when the running config is what z9 wants, nothing of z9's is pending, every node
         reports the zone ``available`` and z9 holds no lock; else one step ``apply``.
apply    1. a lock token z9 recorded (an earlier job that died holding it) is released with that
            token — never ``force``: a lock someone else took stays, reported (the region's
            condition ``sdn_locked``) and the job retries;
         2. the lock taken (``POST /cluster/sdn/lock``, pending edits allowed) and its token recorded;
         3. pending edits z9 did not make (another zone or VNet ``new``/``changed``/``deleted``) →
            the lock released, nothing applied nor rolled back, the condition ``foreign_sdn_edits``
            names them, the job retries;
         4. z9's zone made when missing, the VNets wanted created, those not wanted deleted (each
            with the token);
         5. ``PUT /cluster/sdn`` with the token (``release-lock``), its task waited for;
         6. every node's view of the zone polled until ``available`` (≤ ``sdn_reload_wait_s``): a
            node that did not reload → the condition ``node_reload_failed`` and a retry naming it.
verify   the running config and the nodes as wanted; record: the region's apply counted, its
         condition cleared.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from z9.common import metrics
from z9.common.errors import Snooze, TemporaryError
from z9.common.models import Job
from z9.executor.context import JobContext, Step
from z9.resources.network import SDN_APPLY
from z9.resources.network import store as net_store
from z9.resources.network.pve import LOCK_REFUSED, ProxmoxSdn

log = logging.getLogger("z9.executor.sdn")

KIND = SDN_APPLY
APPLY = "apply"
GONE = ("destroying", "deleted")


@dataclass
class Wanted:
    """What the region's networks want of the SDN: vnet -> tag (present), and the vnets to remove."""

    present: dict[str, int] = field(default_factory=dict)
    absent: set[str] = field(default_factory=set)
    ours: set[str] = field(default_factory=set)  # every VNet z9 ever made in the region
    aliases: dict[str, str] = field(default_factory=dict)  # vnet -> its network's name (the VNet's alias)


@dataclass
class World:
    wanted: Wanted
    zone: str
    zone_running: bool
    zone_pending: bool
    running: dict[str, dict[str, Any]]
    pending: dict[str, dict[str, Any]]
    pending_zones: dict[str, dict[str, Any]]
    nodes: dict[str, str]
    recorded_token: str | None


def plan_world(w: World) -> list[Step]:
    """Pure: [] when nothing is left to apply (see the module docstring)."""
    mine_pending = [v for v, c in w.pending.items() if v in w.wanted.ours and c.get("state")]
    todo = (not w.zone_running or any(v not in w.running for v in w.wanted.present)
            or any(v in w.running or v in w.pending for v in w.wanted.absent) or mine_pending
            or any(s != "available" for s in w.nodes.values()) or w.recorded_token)
    return [Step(APPLY, {"wanted": sorted(w.wanted.present), "removed": sorted(w.wanted.absent & set(w.running))})] \
        if todo else []


def foreign_edits(w: World) -> list[str]:
    """The pending SDN edits z9 did not make (objects with a ``state``)."""
    out = [f"zone {z} ({c['state']})" for z, c in sorted(w.pending_zones.items()) if c.get("state") and z != w.zone]
    out += [f"vnet {v} ({c['state']})" for v, c in sorted(w.pending.items())
            if c.get("state") and v not in w.wanted.ours]
    return out


def _zone_params(ctx: JobContext) -> dict[str, Any]:
    sdn = ctx.settings.regions[ctx.job.region].sdn
    assert sdn is not None
    p: dict[str, Any] = {"zone": sdn.zone, "type": sdn.type}
    if sdn.type == "vxlan":
        p["peers"] = ",".join(str(x) for x in sdn.peers)
    else:
        p["bridge"] = sdn.bridge
    if sdn.mtu:
        p["mtu"] = sdn.mtu
    return p


async def _wanted(conn: Any, region: str) -> Wanted:
    w = Wanted()
    for r in await net_store.vnets_of_region(conn, region):
        w.ours.add(r["vnet"])
        if r["status"] in GONE:
            w.absent.add(r["vnet"])
        else:
            w.present[r["vnet"]] = int(r["vni"])
            w.aliases[r["vnet"]] = r["name"]
    w.absent -= set(w.present)  # a tag given again after a deletion: the new network's VNet stays
    return w


async def _read(ctx: JobContext, wanted: Wanted, recorded: str | None) -> World:
    sdn = ctx.settings.regions[ctx.job.region].sdn
    if sdn is None:
        raise TemporaryError(f"region {ctx.job.region} has no SDN zone configured (RegionSettings.sdn)")
    ops = ProxmoxSdn(ctx.pve)
    zones_pending = {str(z["zone"]): z for z in await ops.zones(pending=True)}
    zones_running = {str(z["zone"]) for z in await ops.zones(running=True)}
    running = {str(v["vnet"]): v for v in await ops.vnets(running=True)}
    pending = {str(v["vnet"]): v for v in await ops.vnets(pending=True)}
    nodes = {}
    for n in await ops.nodes():
        got = {str(z.get("zone")): str(z.get("status")) for z in await ops.node_zones(n)}
        nodes[n] = got.get(sdn.zone, "")
    if not wanted.present and sdn.zone not in zones_running:
        nodes = {}  # no network yet: nothing to wait for
    return World(wanted, sdn.zone, sdn.zone in zones_running, sdn.zone in zones_pending, running, pending,
                 zones_pending, nodes, recorded)


async def observe(ctx: JobContext) -> World:
    waited = ctx.clock.time() - ctx.job.created_at.timestamp()
    if ctx.job.attempt <= 1 and waited < ctx.settings.sdn_apply_batch_s and not ctx.memo.get("batched"):
        await ctx.remember(batched=True)
        raise Snooze(f"gathering the region's SDN edits for {ctx.settings.sdn_apply_batch_s:g}s",
                     delay_s=max(0.05, ctx.settings.sdn_apply_batch_s - waited))
    async with ctx.pool.acquire() as conn, conn.transaction():
        row = await net_store.sdn_region_lock(conn, ctx.job.region)
        await net_store.sdn_region_take_apply(conn, ctx.job.region, ctx.job.id)
        wanted = await _wanted(conn, ctx.job.region)
    # what this apply is for: verify checks these (edits made since are the next apply's)
    await ctx.remember(present=sorted(wanted.present), absent=sorted(wanted.absent))
    return await _read(ctx, wanted, row.get("lock_token"))


def plan(job: Job, world: World) -> list[Step]:
    return plan_world(world)


def _blocked_metric(region: str, code: str | None) -> None:
    """``z9_sdn_apply_blocked{region, code}``: 1 for the condition now, 0 for the others."""
    for c in metrics.SDN_BLOCK_CODES:
        metrics.SDN_APPLY_BLOCKED.labels(region, c).set(1 if c == code else 0)


async def _condition(ctx: JobContext, code: str | None, message: str = "", **more: Any) -> None:
    cond = {"code": code, "message": message, "job_id": ctx.job.id, **more} if code else None
    await net_store.sdn_region_set_condition(ctx.pool, ctx.job.region, cond)
    _blocked_metric(ctx.job.region, code)


async def _record_lock(ctx: JobContext, token: str | None) -> None:
    await ctx.fence()
    await net_store.sdn_region_record_lock(ctx.pool, ctx.job.region, token, ctx.job.id)


async def _release_recorded(ctx: JobContext, ops: ProxmoxSdn, token: str) -> None:
    """Release the lock z9 recorded (an earlier job died holding it) — with that token only."""
    try:
        await ops.unlock(token)
    except TemporaryError as e:
        if LOCK_REFUSED not in str(e):
            raise
        # the lock PVE holds is not the one z9 recorded: someone else's — left alone
        await _record_lock(ctx, None)
        await _condition(ctx, "sdn_locked", f"the SDN config is locked under a token z9 did not mint: {e}; "
                                            "z9 leaves it alone (delete /etc/pve/sdn/.lock or its holder's "
                                            "DELETE /cluster/sdn/lock)")
        raise TemporaryError(f"the SDN lock is held by another client (not z9's recorded token): left alone; {e}")
    await _record_lock(ctx, None)


async def apply(ctx: JobContext, world: World, step: Step) -> None:
    ops = ProxmoxSdn(ctx.pve)
    if world.recorded_token:
        await ctx.step_detail(step, released_recorded_lock=True)
        await _release_recorded(ctx, ops, world.recorded_token)
    # (a lock token is recorded the moment PVE answers, before any use: a job that dies after this
    # point leaves a token the next one releases)
    await ctx.fence()
    try:
        token = await ops.lock()
    except TemporaryError as e:
        if LOCK_REFUSED not in str(e):
            raise
        await _condition(ctx, "sdn_locked", f"the SDN config is locked by a client other than z9: {e}; z9 "
                                            "leaves it alone and applies once it is released")
        raise TemporaryError(f"the SDN config is locked by another client: left alone, waiting; {e}")
    await _record_lock(ctx, token)
    applied = False
    try:
        again = await _read(ctx, world.wanted, token)
        foreign = foreign_edits(again)
        if foreign:
            await _condition(ctx, "foreign_sdn_edits",
                             "pending SDN edits z9 did not make block the region's SDN apply (PVE's apply "
                             "commits every pending edit, cluster-wide): " + ", ".join(foreign)
                             + "; z9 neither applies nor rolls them back — apply or roll them back in Proxmox",
                             objects=foreign)
            raise TemporaryError("blocked: pending SDN edits z9 did not make: " + ", ".join(foreign))
        if not again.zone_pending:
            await ctx.fence()
            await ops.zone_create(_zone_params(ctx), token)
        sdn = ctx.settings.regions[ctx.job.region].sdn
        assert sdn is not None
        for vnet, tag in sorted(world.wanted.present.items()):
            if vnet not in again.pending or again.pending[vnet].get("state") == "deleted":
                await ctx.fence()
                await ops.vnet_create({"vnet": vnet, "zone": sdn.zone, "tag": tag,
                                       "alias": world.wanted.aliases.get(vnet, vnet)}, token)
        for vnet in sorted(world.wanted.absent):
            if vnet in again.pending and again.pending[vnet].get("state") != "deleted":
                await ctx.fence()
                await ops.vnet_delete(vnet, token)
        await ctx.fence()
        upid = await ops.apply(token)
        applied = True
        await ctx.remember(applied=True)
        await _record_lock(ctx, None)  # committed with release-lock: PVE dropped it
        await ctx.step_detail(step, applied=True)
        status = await ctx.wait_task(step, upid)
        if status != "OK" and not status.startswith("WARNINGS"):
            raise TemporaryError(f"SDN apply task {upid} ended {status}")
    finally:
        if not applied:
            try:
                await ops.unlock(token)
                await _record_lock(ctx, None)
            except Exception as e:  # noqa: BLE001 — the token stays recorded: the next job releases it
                log.warning("job %s: the SDN lock could not be released (%s); its token stays recorded for "
                            "the next apply job to release", ctx.job.id, e)
    await _wait_nodes(ctx, ops, world.zone)


async def _wait_nodes(ctx: JobContext, ops: ProxmoxSdn, zone: str) -> None:
    """Every node's view of the zone ``available`` (PVE's apply task ends OK whatever a node's reload
    did), polled for at most ``sdn_reload_wait_s``; else a retry naming the nodes."""
    deadline = ctx.clock.monotonic() + ctx.settings.sdn_reload_wait_s
    while True:
        late = {}
        for n in await ops.nodes():
            got = {str(z.get("zone")): str(z.get("status")) for z in await ops.node_zones(n)}
            if got.get(zone) != "available":
                late[n] = got.get(zone) or "absent"
        if not late:
            return
        ctx.touch()
        if ctx.clock.monotonic() > deadline:
            names = ", ".join(f"{n} ({s})" for n, s in sorted(late.items()))
            await _condition(ctx, "node_reload_failed", f"node {names} did not reload the SDN config: its zone "
                                                        f"{zone} is not available there", nodes=sorted(late))
            raise TemporaryError(f"the SDN config is applied but node {names} does not report zone {zone} "
                                 "available (its network reload failed); applying again")
        await asyncio.sleep(min(0.5, ctx.settings.task_poll_s * 2))


async def verify(ctx: JobContext) -> dict[str, Any]:
    async with ctx.pool.acquire() as conn:
        wanted = await _wanted(conn, ctx.job.region)
        row = await net_store.sdn_region_get(conn, ctx.job.region)
    meant = set(ctx.memo.get("present") or ())
    wanted.present = {v: t for v, t in wanted.present.items() if v in meant}
    wanted.absent &= set(ctx.memo.get("absent") or ())
    w = await _read(ctx, wanted, (row or {}).get("lock_token"))
    left = plan_world(w)
    if left:
        raise TemporaryError(f"verify: the region's SDN is not as wanted yet: {left[0].detail}")
    # the region's row is written here, not in record: the finishing transaction holds the job's
    # lock keys (sdn:<region>), which a network edit takes *after* this row (ensure_apply) — the
    # other order would deadlock the two
    if ctx.memo.get("applied"):
        await net_store.sdn_region_applied(ctx.pool, ctx.job.region)
    else:
        await net_store.sdn_region_set_condition(ctx.pool, ctx.job.region, None)
    _blocked_metric(ctx.job.region, None)
    return {"vnets": sorted(wanted.present), "nodes": w.nodes}


RECORDS_NOTHING = True


async def record(conn: Any, ctx: JobContext, seen: dict[str, Any]) -> None:
    return None


async def record_failure(conn: Any, ctx: JobContext, error: dict[str, Any]) -> None:
    return None  # the region's condition says what blocks it; the networks' own jobs carry their reasons
