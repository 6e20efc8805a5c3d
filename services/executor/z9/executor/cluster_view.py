"""The executor process's shared view of a region's ``/cluster/resources`` (one short-lived
snapshot answers every job's "which VMs carry this tag" instead of one request each), and what this
process last read of each VM on its node, so a fresh per-VM read wins over an older listing."""
from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from z9.common import metrics
from z9.common.tags import normalize_tags

from .pve_types import VmRef

@dataclass
class _Seen:
    """What this process last read of one VM on its node: ``tags`` None when its config was not
    there. ``at`` is ``time.monotonic()`` when the read was sent."""

    at: float
    node: str
    tags: frozenset[str] | None
    name: str | None
    template: bool


def _vm_ref(r: dict[str, Any]) -> VmRef:
    return VmRef(vmid=int(r["vmid"]), node=r["node"], name=r.get("name"), status=r.get("status"),
                 tags=normalize_tags(r.get("tags")), lock=r.get("lock") or None,
                 template=bool(int(r.get("template") or 0)))


def _row_tags(raw: str | None) -> list[str]:
    """The tags of a ``/cluster/resources`` row, fast: PVE stores them ``;``-joined; any other
    separator (``,``, white space) falls back to :func:`normalize_tags`."""
    if not raw:
        return []
    if _OTHER_TAG_SEP.search(raw):
        return list(normalize_tags(raw))
    return [t for t in raw.lower().split(";") if t]


_OTHER_TAG_SEP = re.compile(r"[,\s]")


class ClusterSnapshot:
    """One answer of ``GET /cluster/resources?type=vm``, indexed by tag, requested at ``started``
    and received at ``received`` (``time.monotonic()``). Lookups lay over it what this process
    read of single VMs since it was requested (:meth:`ClusterView.saw`), so a process sees its own
    changes at once without listing the cluster again. Rows become :class:`VmRef` only when a
    lookup returns them (a listing of 10,000 VMs is indexed, not converted)."""

    def __init__(self, view: "ClusterView", started: float, received: float, rows: list[dict[str, Any]]):
        self.view = view
        self.started = started
        self.received = received
        self.rows = [r for r in rows if r.get("type") in (None, "qemu")]
        self.vmids = {int(r["vmid"]) for r in self.rows}
        self.by_tag: dict[str, list[int]] = {}
        for i, r in enumerate(self.rows):
            for t in _row_tags(r.get("tags")):
                self.by_tag.setdefault(t, []).append(i)

    def _newer(self) -> list[tuple[int, _Seen]]:
        return [(vmid, s) for vmid, s in self.view.seen.items() if s.at >= self.started]

    def tagged(self, tag: str) -> list[VmRef]:
        """The VMs carrying ``tag``: the snapshot's, plus those this process read with the tag
        since the snapshot was requested, minus those it read without it (or found gone from the
        node the snapshot names) after the snapshot arrived. Candidates only: confirm each one by
        its own config."""
        hits = {v.vmid: v for v in (_vm_ref(self.rows[i]) for i in self.by_tag.get(tag, ()))}
        for vmid, s in self._newer():
            if s.tags is not None and tag in s.tags:
                hits[vmid] = VmRef(vmid=vmid, node=s.node, name=s.name, status=None, tags=s.tags, lock=None,
                                   template=s.template)
            elif s.at > self.received and vmid in hits and hits[vmid].node == s.node:
                del hits[vmid]
        return sorted(hits.values(), key=lambda v: v.vmid)

    def refs(self) -> list[VmRef]:
        """Every VM of the snapshot with this process's newer reads laid over it (as
        :meth:`tagged`)."""
        out = {v.vmid: v for v in map(_vm_ref, self.rows)}
        for vmid, s in self._newer():
            if s.tags is not None:
                old = out.get(vmid)
                out[vmid] = VmRef(vmid=vmid, node=s.node, name=s.name, status=old.status if old else None,
                                  tags=s.tags, lock=old.lock if old else None, template=s.template)
            elif s.at > self.received and vmid in out and out[vmid].node == s.node:
                del out[vmid]
        return sorted(out.values(), key=lambda v: v.vmid)

    def templates(self) -> list[VmRef]:
        """The templates of the snapshot (the template flag is fresh in the listing)."""
        return [_vm_ref(r) for r in self.rows if int(r.get("template") or 0)]


class ClusterView:
    """The executor process's shared, short-lived view of ``/cluster/resources`` (issue 13 §4).

    At 10,000 VMs a listing costs the hypervisor (and z9) ~100–250 ms; a job used to list the
    cluster about four times. Now every job of the process shares one snapshot at most
    ``max_age_s`` old, and concurrent callers share the one request in flight (single-flight).
    A caller that needs a listing newer than some moment (after its claim, after a disagreement
    with a VM's own config) passes ``not_before``: only then is a new request sent, shared in
    turn by everyone waiting. The snapshot only names candidates: callers confirm each VM by its
    own config, and every such read is laid over the snapshot (:meth:`saw`), so the process's
    own changes (tags set by a configure, a VM gone after a destroy) are seen at once.
    ``fetches`` counts the listings sent, ``shared`` the lookups answered without one."""

    def __init__(self, fetch: Callable[[], Awaitable[list[dict[str, Any]]]], max_age_s: float, region: str = "",
                 create_max_age_s: float | None = None):
        self._fetch = fetch
        self.region = region
        self.max_age_s = max_age_s
        # for lookups with an authority of their own for "none" (get(for_create=True))
        self.create_max_age_s = max(max_age_s, create_max_age_s if create_max_age_s is not None else max_age_s)
        self._snap: ClusterSnapshot | None = None
        self._inflight: asyncio.Future | None = None
        self._inflight_started = 0.0
        self.seen: dict[int, _Seen] = {}
        self.fetches = 0
        self.shared = 0

    @property
    def latest(self) -> ClusterSnapshot | None:
        """The newest snapshot received, whatever its age (None before the first)."""
        return self._snap

    async def get(self, not_before: float | None = None, *, for_create: bool = False) -> ClusterSnapshot:
        """A snapshot requested no earlier than ``not_before`` and at most ``max_age_s`` old —
        ``create_max_age_s`` with ``for_create`` (callers whose "none" has another authority)."""
        floor = float("-inf") if not_before is None else not_before
        max_age = self.create_max_age_s if for_create else self.max_age_s
        snap = self._snap
        if snap is not None and snap.started >= floor and time.monotonic() - snap.started <= max_age:
            self.shared += 1
            metrics.proxmox_snapshot_lookup(self.region, "shared")
            return snap
        fut = self._inflight
        if fut is None or self._inflight_started < floor:
            started = time.monotonic()
            fut = asyncio.ensure_future(self._run(started))
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved even with no waiter left
            self._inflight, self._inflight_started = fut, started
            metrics.proxmox_snapshot_lookup(self.region, "listed")
        else:
            self.shared += 1
            metrics.proxmox_snapshot_lookup(self.region, "shared")
        # shield: one waiter's cancellation must not cancel the request the others wait on
        return await asyncio.shield(fut)

    async def _run(self, started: float) -> ClusterSnapshot:
        self.fetches += 1
        try:
            rows = await self._fetch()
        finally:
            if self._inflight_started == started:
                self._inflight = None
        snap = ClusterSnapshot(self, started, time.monotonic(), rows)
        if self._snap is None or started > self._snap.started:
            self._snap = snap
            # reads sent before this listing was requested are in it (or superseded by it)
            self.seen = {vmid: s for vmid, s in self.seen.items() if s.at >= started}
        return snap

    def saw(self, vmid: int, node: str, state_tags: frozenset[str] | None, at: float,
            name: str | None = None, template: bool = False) -> None:
        """Record a read of VM ``vmid`` on ``node`` sent at ``at`` (``tags`` None: not there)."""
        old = self.seen.get(vmid)
        if old is None or old.at <= at:
            self.seen[vmid] = _Seen(at, node, state_tags, name, template)
