"""The volume's capability of the Proxmox adapter: what a volume's job asks of a region's storage and disks.

A narrow Protocol (:class:`DiskOps`) that the volume steps depend on, and its implementation over the
region's :class:`~z9.executor.proxmox.ProxmoxClient` (the one module that imports proxmoxer; its single
error boundary, ``call``, translates every failure; the endpoints called here that the client does not
call itself are the type's ``pve_endpoints``). The calls, and the PVE sources they follow:

- :meth:`create_vm` — ``POST /nodes/{node}/qemu`` with ``scsi0=<storage>:<GiB>,serial=…``: qemu-server
  API2/Qemu.pm create_vm → create_disks → PVE::Storage::vdisk_alloc (a ``qmcreate`` task; the config
  holds only ``lock: create`` until it ends). A vmid taken meanwhile: VmidTaken.
- :meth:`reassign` — ``POST …/move_disk`` with ``target-vmid`` (PVE ≥ 7.2): a ``qmmove`` task renames the
  volume for the target (PVE::Storage::rename_volume; no copy) and writes it into the target's config,
  hot-plugged when the target runs ($update_vm_api). Both VMs on one node; the source stopped unless the
  disk is ``unusedN``; ``digest``/``target-digest`` refuse a config changed since it was read.
- :meth:`configure` / :meth:`resize` / :meth:`migrate` / :meth:`destroy` — the client's own calls
  (``POST …/config``, ``PUT …/resize``, ``POST …/migrate``, ``DELETE …``).
- :meth:`images` — ``GET /nodes/{node}/storage/{storage}/content?content=images[&vmid=]`` (pve-storage
  API2/Storage/Content.pm index): what is on the storage, orphans included.
"""
from __future__ import annotations

from typing import Any, Protocol

from z9.executor.proxmox import ProxmoxClient, VmState


class DiskOps(Protocol):
    """What the volume steps call (a fake in the pure tests, :class:`ProxmoxDisks` in the executor)."""

    async def vm_state(self, node: str, vmid: int, *, status: bool = True) -> VmState | None: ...

    async def pick_vmid(self) -> int: ...

    async def create_vm(self, node: str, vmid: int, params: dict[str, Any]) -> str: ...

    async def reassign(self, node: str, vmid: int, disk: str, target_vmid: int, target_disk: str, *,
                       digest: str | None = None, target_digest: str | None = None) -> str: ...

    async def configure(self, node: str, vmid: int, params: dict[str, Any], *, digest: str | None) -> str: ...

    async def resize(self, node: str, vmid: int, disk: str, size_gib: int, *,
                     digest: str | None = None) -> str | None: ...

    async def migrate(self, node: str, vmid: int, target: str) -> str: ...

    async def destroy(self, node: str, vmid: int) -> str: ...

    async def images(self, node: str, storage: str, vmid: int | None = None) -> list[dict[str, Any]]: ...


class ProxmoxDisks:
    """:class:`DiskOps` over a region's client: reads and the VM calls are the client's own; the
    storage calls go through its one error boundary."""

    def __init__(self, pve: ProxmoxClient):
        self.pve = pve
        self.vm_state = pve.vm_state
        self.pick_vmid = pve.pick_vmid
        self.configure = pve.configure
        self.resize = pve.resize
        self.migrate = pve.migrate
        self.destroy = pve.destroy

    async def create_vm(self, node: str, vmid: int, params: dict[str, Any]) -> str:
        """``POST /nodes/{node}/qemu`` → the ``qmcreate`` UPID (its disks allocated by the task)."""
        api = self.pve.api
        return await self.pve.call("POST /nodes/{node}/qemu", f"create VM {vmid} on {node}",
                                    lambda: api.nodes(node).qemu.post(vmid=vmid, **params))

    async def reassign(self, node: str, vmid: int, disk: str, target_vmid: int, target_disk: str, *,
                       digest: str | None = None, target_digest: str | None = None) -> str:
        """``POST …/move_disk`` of ``disk`` to VM ``target_vmid`` as ``target_disk`` → the ``qmmove`` UPID."""
        data: dict[str, Any] = {"disk": disk, "target-vmid": target_vmid, "target-disk": target_disk}
        if digest:
            data["digest"] = digest
        if target_digest:
            data["target-digest"] = target_digest
        api = self.pve.api
        return await self.pve.call("POST /nodes/{node}/qemu/{vmid}/move_disk",
                                    f"reassign {disk} of VM {vmid} to VM {target_vmid} as {target_disk}",
                                    lambda: api.nodes(node).qemu(vmid).move_disk.post(**data))

    async def images(self, node: str, storage: str, vmid: int | None = None) -> list[dict[str, Any]]:
        api = self.pve.api
        params: dict[str, Any] = {"content": "images", **({"vmid": vmid} if vmid is not None else {})}
        rows = await self.pve.call("GET /nodes/{node}/storage/{storage}/content", f"list images on {storage}",
                                    lambda: api.nodes(node).storage(storage).content.get(**params))
        return [dict(r) for r in rows or []]


__all__ = ["DiskOps", "ProxmoxDisks"]
