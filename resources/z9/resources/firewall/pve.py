"""The firewall type's capability of the Proxmox adapter: the cluster IP sets ("members of firewall X":
``+dc/<name>`` in a rule), through the region client's one error boundary (``ProxmoxClient.call``; the
endpoints are the type's ``pve_endpoints``). pve-firewall ``src/PVE/API2/Firewall/IPSet.pm`` (ClusterIPSetList,
ClusterIPset: the same handlers as a VM's sets, on ``cluster.fw``; ``Sys.Audit``/``Sys.Modify`` on ``/``):
a duplicate set is 400 ``IPSet '<name>' already exists``, a missing one 500 ``no such IPSet '<name>'``, a
duplicate entry 400 ``address '<cidr>' already exists``, deleting an entry that is not there succeeds."""
from __future__ import annotations

from typing import Any

from z9.executor.proxmox import EntryExists, EntryMissing, ProxmoxClient


class ClusterIpsets:
    def __init__(self, pve: ProxmoxClient):
        self.pve = pve

    async def names(self) -> set[str]:
        api = self.pve.api
        rows = await self.pve.call("GET /cluster/firewall/ipset", "list the cluster's IP sets",
                                   lambda: api.cluster.firewall.ipset.get())
        return {str(r["name"]) for r in rows or []}

    async def entries(self, name: str) -> list[dict[str, Any]] | None:
        api = self.pve.api
        try:
            rows = await self.pve.call("GET /cluster/firewall/ipset/{name}", f"read cluster IP set {name}",
                                       lambda: api.cluster.firewall.ipset(name).get())
        except EntryMissing:
            return None
        return [dict(r) for r in rows or []]

    async def create(self, name: str, comment: str) -> None:
        api = self.pve.api
        try:
            await self.pve.call("POST /cluster/firewall/ipset", f"create cluster IP set {name}",
                                lambda: api.cluster.firewall.ipset.post(name=name, comment=comment))
        except EntryExists:
            return

    async def add(self, name: str, cidr: str, comment: str) -> None:
        api = self.pve.api
        try:
            await self.pve.call("POST /cluster/firewall/ipset/{name}", f"add {cidr} to cluster IP set {name}",
                                lambda: api.cluster.firewall.ipset(name).post(cidr=cidr, comment=comment))
        except EntryExists:
            return

    async def remove(self, name: str, cidr: str) -> None:
        api = self.pve.api
        await self.pve.call("DELETE /cluster/firewall/ipset/{name}/{cidr}", f"remove {cidr} from cluster IP set {name}",
                            lambda: api.cluster.firewall.ipset(name)(cidr).delete())

    async def delete(self, name: str) -> None:
        api = self.pve.api
        try:
            await self.pve.call("DELETE /cluster/firewall/ipset/{name}", f"delete cluster IP set {name}",
                                lambda: api.cluster.firewall.ipset(name).delete(force=1))
        except EntryMissing:
            return
