"""The network's capability of the Proxmox adapter: what a network's jobs ask of a region's SDN.

Every call goes through :meth:`~z9.executor.proxmox.ProxmoxClient.call` (the one error boundary; the
endpoints are the type's ``pve_endpoints``). The calls, and the pve-network sources they follow:

- :meth:`zones` / :meth:`vnets` — ``GET /cluster/sdn/{zones,vnets}`` with ``pending=1`` (each object's
  ``state`` ``new|changed|deleted`` and its ``pending`` keys: ``SDN.pm`` pending_config) or ``running=1``
  (the last applied config).
- :meth:`zone_create`, :meth:`vnet_create`, :meth:`vnet_delete` — pending edits only, each carrying the
  lock token z9 holds (``lock_sdn_config``: without it, while a lock exists, ``invalid lock token
  provided!``).
- :meth:`lock` / :meth:`unlock` — PVE 9's global lock (``POST``/``DELETE /cluster/sdn/lock``).
- :meth:`apply` — ``PUT /cluster/sdn`` (commit every pending edit, release the lock, one
  ``reloadnetworkall`` task that does not watch the nodes' reloads).
- :meth:`node_zones` — ``GET /nodes/{node}/sdn/zones``: a node's own view (``available`` only when its
  local config is at the running version).
"""
from __future__ import annotations

from typing import Any

from z9.executor.proxmox import ProxmoxClient

#: pve-network SDN.pm lock_sdn_config: what every SDN write answers while someone else's lock exists
LOCK_REFUSED = "invalid lock token provided!"


class ProxmoxSdn:
    """The SDN calls over a region's client."""

    def __init__(self, pve: ProxmoxClient):
        self.pve = pve
        self.nodes = pve.nodes

    async def zones(self, *, pending: bool = False, running: bool = False) -> list[dict[str, Any]]:
        api = self.pve.api
        params = {"pending": 1} if pending else {"running": 1} if running else {}
        return [dict(r) for r in await self.pve.call("GET /cluster/sdn/zones", "list SDN zones",
                                                      lambda: api.cluster.sdn.zones.get(**params)) or []]

    async def vnets(self, *, pending: bool = False, running: bool = False) -> list[dict[str, Any]]:
        api = self.pve.api
        params = {"pending": 1} if pending else {"running": 1} if running else {}
        return [dict(r) for r in await self.pve.call("GET /cluster/sdn/vnets", "list SDN VNets",
                                                      lambda: api.cluster.sdn.vnets.get(**params)) or []]

    async def zone_create(self, params: dict[str, Any], token: str) -> None:
        api = self.pve.api
        data = {**params, "lock-token": token}
        await self.pve.call("POST /cluster/sdn/zones", f"create SDN zone {params['zone']}",
                            lambda: api.cluster.sdn.zones.post(**data))

    async def vnet_create(self, params: dict[str, Any], token: str) -> None:
        api = self.pve.api
        data = {**params, "lock-token": token}
        await self.pve.call("POST /cluster/sdn/vnets", f"create SDN VNet {params['vnet']}",
                            lambda: api.cluster.sdn.vnets.post(**data))

    async def vnet_delete(self, vnet: str, token: str) -> None:
        api = self.pve.api
        await self.pve.call("DELETE /cluster/sdn/vnets/{vnet}", f"delete SDN VNet {vnet}",
                            lambda: api.cluster.sdn.vnets(vnet).delete(**{"lock-token": token}))

    async def lock(self) -> str:
        """The global lock's token (pending edits allowed: z9 inspects them under the lock)."""
        api = self.pve.api
        return str(await self.pve.call("POST /cluster/sdn/lock", "take the SDN lock",
                                       lambda: api.cluster.sdn.lock.post(**{"allow-pending": 1})))

    async def unlock(self, token: str) -> None:
        """Release the lock held under ``token`` (never ``force``: a lock z9 did not take stays)."""
        api = self.pve.api
        await self.pve.call("DELETE /cluster/sdn/lock", "release the SDN lock",
                            lambda: api.cluster.sdn.lock.delete(**{"lock-token": token}))

    async def apply(self, token: str) -> str:
        """``PUT /cluster/sdn`` with the token, releasing the lock: the ``reloadnetworkall`` UPID."""
        api = self.pve.api
        return str(await self.pve.call("PUT /cluster/sdn", "apply the SDN config",
                                       lambda: api.cluster.sdn.put(**{"lock-token": token, "release-lock": 1})))

    async def node_zones(self, node: str) -> list[dict[str, Any]]:
        api = self.pve.api
        return [dict(r) for r in await self.pve.call("GET /nodes/{node}/sdn/zones", f"SDN zones of node {node}",
                                                      lambda: api.nodes(node).sdn.zones.get()) or []]


__all__ = ["LOCK_REFUSED", "ProxmoxSdn"]
