"""Periodic drift detection: the reaper plans live resources read-only and records what it found.

Each pass, for every type that says which job converges it (``ResourceType.plan_of``) and every
region this process knows, at most ``drift_batch`` resources are planned — those with no live job
(a job will change them first) whose drift was checked longest ago, none more often than every
``drift_interval_s`` — by the same code as ``POST /v1/<plural>/{id}/actions/plan``
(:func:`z9.executor.preview.plan`: the converging job's own observe and plan, one connection in a
READ ONLY transaction, a read-only Proxmox client). What it found goes to ``resource_drift``
(migration 0028): in sync or not, the drift, the steps, since when it has been drifted. A plan that
cannot be made now (Proxmox unreachable, a VM locked) keeps the resource's last known state.

``z9_resources_drifted{kind}`` and ``z9_resources_drifted_oldest_seconds{kind}`` are set from the
table after each pass (every reaper replica reports the same figure: merge them with ``max``); the
alert ``Z9ResourceDrifted`` fires when a resource stayed drifted for 30 minutes, and the operator's
``GET /v1/operator/drift`` lists them. Several replicas may check the same resource in one pass
(each writes the same finding): nothing is locked.
"""
from __future__ import annotations

import logging
from typing import Any

from z9.common import metrics, store
from z9.common.clock import SYSTEM, Clock
from z9.common.errors import JobError, Snooze, TemporaryError
from z9.common.settings import Settings

from z9 import resources

log = logging.getLogger("z9.reaper")

#: statuses a resource is planned in: live, with a world to compare (a creating one has its create
#: job; a deleting one its deletion)
NOT_PLANNED = ("creating", "deleting", "destroying", "deleted")


class DriftChecker:
    """See the module docstring. ``run_once`` returns how many resources it planned."""

    def __init__(self, settings: Settings, *, clock: Clock = SYSTEM):
        self.settings = settings
        self.clock = clock
        self._clients: dict[str, Any] = {}

    def _client(self, region: str) -> Any:
        from z9.executor.proxmox import ProxmoxClient

        if region not in self._clients:
            self._clients[region] = ProxmoxClient(region, self.settings.regions[region], max_threads=4,
                                                  read_only=True)
        return self._clients[region]

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self._clients.clear()

    async def run_once(self, pool: Any) -> int:
        if self.settings.drift_interval_s <= 0:
            return 0
        from z9.executor import preview

        n = 0
        for rtype in resources.types():
            if rtype.plan_of is None:
                continue
            statuses = [s for s in rtype.statuses if s not in NOT_PLANNED]
            for region in self.settings.regions:
                if self.settings.regions[region].token_secret is None:
                    continue  # this process was given no Proxmox token for the region: it cannot plan there
                due = await store.resource_drift_due(pool, rtype.sql, region, statuses, self.settings.drift_interval_s,
                                                     self.settings.drift_batch, now=self.clock.db_now())
                for record in due:
                    row = rtype.model.from_record(record)
                    await self._check(pool, preview, rtype, row)
                    n += 1
        await self.export(pool)
        return n

    async def _check(self, pool: Any, preview: Any, rtype: Any, row: Any) -> None:
        now = self.clock.db_now()
        try:
            async with pool.acquire() as conn, conn.transaction(readonly=True):
                found = await preview.plan(conn, self._client(row.region), self.settings, rtype, row, clock=self.clock)
        except (Snooze, TemporaryError) as e:
            await store.resource_drift_unknown(pool, row.id, rtype.name, row.tenant_id, row.region, str(e), now=now)
            log.info("%s %s: no plan now (%s); its drift state kept", rtype.name, row.id, e)
            return
        except JobError as e:  # the job itself would fail (two VMs carry its tag, a guard refusal): drifted
            await store.resource_drift_record(pool, row.id, rtype.name, row.tenant_id, row.region, in_sync=False,
                                              job_kind=None, drift=[{"path": "plan", "want": "possible",
                                                                     "have": str(e)}], steps=[], now=now)
            log.warning("%s %s: its job could not converge it: %s", rtype.name, row.id, e)
            return
        if found.waiting is not None:
            await store.resource_drift_unknown(pool, row.id, rtype.name, row.tenant_id, row.region, found.waiting,
                                               now=now)
            return
        body = found.as_json()
        await store.resource_drift_record(pool, row.id, rtype.name, row.tenant_id, row.region,
                                          in_sync=found.in_sync, job_kind=found.kind, drift=body["drift"],
                                          steps=body["steps"], now=now)
        if not found.in_sync:
            log.warning("%s %s drifted: %s", rtype.name, row.id,
                        "; ".join(f"{d['path']} want {d['want']!r} have {d['have']!r}" for d in body["drift"]))

    async def export(self, pool: Any) -> None:
        """The gauges, from the table (what every replica would say)."""
        now = self.clock.time()
        for rtype in resources.types():
            if rtype.plan_of is None:
                continue
            count, since = await store.resource_drift_summary(pool, rtype.sql, rtype.name)
            metrics.RESOURCES_DRIFTED.labels(rtype.name).set(count)
            metrics.RESOURCES_DRIFTED_OLDEST.labels(rtype.name).set(0 if since is None else max(0.0, now - since.timestamp()))
