"""Storages of the simulated cluster: listing, content, ISO uploads (``imgcopy`` tasks) and deletion.

Source: pve-storage ``src/PVE/API2/Storage/{Status,Content}.pm`` and ``Storage.pm``
(``normalize_content_filename``), pve-http-server ``AnyEvent.pm`` (upload handling), and the failures
peers hit (research §2.2: CAPMOX#112/#569, Telmate#1196).

Storages (the same on every node, as ``/etc/pve/storage.cfg``):

======================  ========  ==========================  ======  =====================================
id                      type      content                     shared  path
======================  ========  ==========================  ======  =====================================
``local``               dir       iso, vztmpl, backup, import no      ``/var/lib/vz``
``local-lvm``           lvmthin   images, rootdir             no      (none: not file based)
``isos``                nfs       iso, vztmpl, import         yes     ``/mnt/pve/isos``
``ceph-vm``             rbd       images, rootdir             yes     (none: not file based)
======================  ========  ==========================  ======  =====================================

``ceph-vm`` is the shared storage that holds VM images (a Ceph RBD pool, as a PVE cluster with Ceph
has): a template whose volumes are all on it can be cloned with ``target=`` another node at once
(qemu-server API2/Qemu.pm clone_vm ``$check_storage_access_clone``). pve-storage ``Plugin.pm``
parse_config marks every storage of a type in ``@SHARED_STORAGE`` (iscsi, nfs, cifs, rbd, cephfs,
iscsidirect, zfs, drbd, pbs) ``shared: 1``; a ``dir``/``lvmthin`` storage is node-local unless
``storage.cfg`` says ``shared 1``. A test puts a template there with ``POST /_sim/vms`` and a config
naming ``ceph-vm:base-<vmid>-disk-0`` (and ``ceph-vm:vm-<vmid>-cloudinit``). Its usage is the sum of the
image volumes every node's VMs have on it; ``local-lvm``'s is that of its own node's VMs.

A node-local storage holds one set of files **per node**; a shared storage one set for the cluster.
A volume is ``<storage>:iso/<name>`` and exists only after its ``imgcopy`` task ended OK.

Upload (``POST /nodes/{node}/storage/{storage}/upload``, ``multipart/form-data``; the file part is
named ``filename`` and its file name is the name to create; ``content``, ``checksum`` +
``checksum-algorithm`` are form fields). Checks before the task, in PVE's order (HTTP errors):
unknown storage → 500 ``storage '<s>' does not exist``; not file based → 500 ``can't upload to storage
type '<type>'``; no file part → 500 ``missing temporary file name``; a client-supplied ``tmpfilename`` →
400 ``'tmpfilename' query parameter is not allowed for file uploads``; the name is normalised
(``[^a-zA-Z0-9_.-]`` → ``_``); ``iso`` without ``.iso``/``.img`` → 400 ``errors.filename = "wrong file
extension"`` (``vztmpl`` needs ``.tar.gz|.tar.xz|.tar.zst``, ``import`` ``.ova|.ovf|.qcow2|.raw|.vmdk``);
content not allowed → 500 ``storage '<s>' does not support '<content>' content``. Then a task
``imgcopy`` (UPID id empty) copies the file, **overwriting** an existing one; with a checksum it fails
``checksum mismatch: got '<hex>' != expect '<given>'`` and no file is written.

Node-local versus shared, and the receiving node (the CAPMOX#112 class): the simulator listens once per
node (:class:`z9.sim.server.SimServer` ``node_urls``); a request arriving at node A's listener is
received by A. ``upload`` has no ``proxyto`` (pve-storage 9 ``Status.pm``): the worker runs on the node
that **received** the file, so an upload through A's API naming node B returns a UPID **of node A**
(asking B for it answers 400 ``no such task``, community.proxmox#222) and the task copies the file to B
with scp (log ``command: /usr/bin/scp … [<B's address>]:<dest>``). Where the file lands follows the
storage: node B's own ``local``, or the one shared ``isos``. A VM whose config references a volume its
node cannot see fails to start with ``volume '<volid>' does not exist`` (the ISO uploaded to another
node's ``local``). The older failure of CAPMOX#112 (``import failed: /usr/bin/scp: stat local
"/var/tmp/pveupload-…": No such file or directory``) is reproduced with a ``fail_task`` fault whose
``exitstatus`` is that text, see :func:`capmox_112_exitstatus`.

Faults (admin ``/_sim/faults``, matched on the upload path): ``corrupt`` stores the bytes with one
byte changed (so a checksum mismatches, and an ISO without a checksum is unreadable to the guest);
``abort`` reads part of the body and closes the connection (the upload broke off: no task, no file).

VM image volumes (``<storage>:vm-<vmid>-disk-<n>``) live in the VM configs that reference them
(:meth:`Storage.image_volumes`); a volume no config references any more but that still exists — a
disk of another VM's detached ``unusedN`` deleted from a config (qemu-server QemuServer.pm
``try_deallocate_drive``: "If vm is not owner of this disk remove from config" — only the owner frees
it), or a referenced volume of another owner when a VM is destroyed (QemuServer.pm ``destroy_vm``
``$remove_owned_drive``: ``return if ... $owner != $vmid``) — is an **orphan**: listed in the content
of its storage with the ``vmid`` of its name, counted in ``used``, freed by a destroy of its owner with
``destroy-unreferenced-disks=1`` (``destroy_vm`` ``$purge_unreferenced``) or a ``DELETE …/content``.
New names come from :meth:`Storage.free_disk_name` (pve-storage ``Plugin::find_free_diskname``: the
lowest ``n`` no volume of that vmid on the storage has, orphans included).

Deletion (``DELETE …/content/{volume}``, ``volume`` = ``iso/x.iso`` or the full volid; another storage's
volid → 400 ``errors.volume = "storage ID mismatch (<a> != <b>)"``): a task ``imgdel`` (UPID id = the
storage); with ``delay`` the call waits up to that many seconds and answers ``null`` when the task ended
without error (its error as a 500 otherwise). A missing file is a warning, as in ``Plugin::free_image``:
the task ends ``WARNINGS: 1`` with ``WARN: disk image '<path>' does not exist``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .disks import DISK_RE, parse_size
from .errors import PveError, param_error
from .tasks import TaskPlan

if TYPE_CHECKING:  # pragma: no cover
    from .cluster import Cluster
    from .tasks import Task

GiB = 1024**3
ISO_EXT_RE = re.compile(r"[^/]+\.(?:iso|img)$", re.I)
VZTMPL_EXT_RE = re.compile(r"[^/]+\.tar\.(?:gz|xz|zst)$", re.I)
IMPORT_EXT_RE = re.compile(r"[^/]+\.(?:ova|ovf|qcow2|raw|vmdk)$", re.I)


@dataclass(frozen=True)
class StorageDef:
    id: str
    type: str
    content: tuple[str, ...]
    shared: bool
    path: str | None
    total: int = 400 * GiB


STORAGES: tuple[StorageDef, ...] = (
    StorageDef("local", "dir", ("backup", "import", "iso", "vztmpl"), False, "/var/lib/vz", 100 * GiB),
    StorageDef("local-lvm", "lvmthin", ("images", "rootdir"), False, None, 400 * GiB),
    StorageDef("isos", "nfs", ("import", "iso", "vztmpl"), True, "/mnt/pve/isos", 1024 * GiB),
    # a Ceph RBD pool for VM images: shared (pve-storage Plugin.pm @SHARED_STORAGE has 'rbd')
    StorageDef("ceph-vm", "rbd", ("images", "rootdir"), True, None, 2048 * GiB),
)


@dataclass
class Volume:
    volid: str
    content: str
    format: str
    data: bytes
    ctime: int

    @property
    def size(self) -> int:
        return len(self.data)

    def to_json(self) -> dict:
        return {"volid": self.volid, "content": self.content, "format": self.format, "size": self.size,
                "ctime": self.ctime, "sha256": hashlib.sha256(self.data).hexdigest()}


def capmox_112_exitstatus(tmp: str = "/var/tmp/pveupload-d8b6bc08693595b3c3911689a95457d7") -> str:
    """The ``imgcopy`` failure CAPMOX#112 reported (PVE 8.1), for a ``fail_task`` fault."""
    return f'import failed: /usr/bin/scp: stat local "{tmp}": No such file or directory'


def node_ip(cluster: "Cluster", node: str) -> str:
    return f"192.0.2.{11 + cluster.nodes.index(node)}"


_VOLNAME_RES = (re.compile(r"\d+/\S+"), re.compile(r"iso/[^/]+\.(?:iso|img)", re.I),
                re.compile(r"vztmpl/[^/]+\.tar\.(?:gz|xz|zst)", re.I), re.compile(r"rootdir/\d+"),
                re.compile(r"backup/[^/]+"), re.compile(r"snippets/[^/]+"),
                re.compile(r"import/[^/]+\.(?:ova|ovf|qcow2|raw|vmdk)", re.I))


LVM_VOLNAME_RE = re.compile(r"(?:base-\d+-\S+/)?(?:vm|base)-\d+-\S+")  # LvmThinPlugin::parse_volname


def check_volname(sdef: "StorageDef", volname: str) -> None:
    """``Plugin::parse_volname`` of a file-based storage (called through ``PVE::Storage::path`` before any
    work): a name outside its layout, e.g. with ``..`` or a sub-directory, is refused."""
    if sdef.path is None:
        if not LVM_VOLNAME_RE.fullmatch(volname):  # RBDPlugin::parse_volname has the same layout
            raise PveError(500, f"unable to parse {'rbd' if sdef.type == 'rbd' else 'lvm'} volume name '{volname}'")
        return
    if not any(rx.fullmatch(volname) for rx in _VOLNAME_RES):
        raise PveError(500, f"unable to parse directory volume name '{volname}'")


def owner_of(volname: str) -> int | None:
    """The owner vmid of an image volume name (pve-storage ``parse_volname``: ``vm-<vmid>-…``,
    ``base-<vmid>-…``, a linked clone ``base-<b>-disk-0/vm-<vmid>-…`` is the clone's)."""
    m = re.fullmatch(r"(?:base-\d+-[^/]+/)?(?:vm|base)-(\d+)-.+", volname)
    return int(m.group(1)) if m else None


def volume_type(volid: str) -> tuple[str, int | None]:
    """``(vtype, owner vmid)`` of a volume id as pve-storage ``parse_volname`` gives them (Plugin.pm:
    ``iso/…``, ``vztmpl/…``, ``backup/…``, ``snippets/…``, ``import/…``; an image ``<vmid>/<name>`` on a
    directory storage, ``vm-<vmid>-…``/``base-<vmid>-…`` on LVM-thin and RBD)."""
    volname = volid.partition(":")[2]
    kind = volname.split("/", 1)[0]
    if kind in ("iso", "vztmpl", "backup", "snippets", "import") and "/" in volname:
        return kind, None
    m = re.fullmatch(r"(\d+)/.+", volname)
    return "images", int(m.group(1)) if m else owner_of(volname)


def normalize_filename(name: str) -> str:
    """``PVE::Storage::normalize_content_filename``: base name, ``[^a-zA-Z0-9_.-]`` → ``_``."""
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    return re.sub(r"[^a-zA-Z0-9_.\-]", "_", name)


@dataclass
class Storage:
    """The files on the cluster's storages: ``files[(storage, node or None if shared)][volname]``."""

    cluster: "Cluster"
    files: dict[tuple[str, str | None], dict[str, Volume]] = field(default_factory=dict)
    # image volumes no VM config references: {(storage, node or None if shared): {volname: size}}
    orphans: dict[tuple[str, str | None], dict[str, int]] = field(default_factory=dict)
    # the sizes of image volumes a config names without ``size=`` (an ``unusedN``): {volid: bytes}
    sizes: dict[str, int] = field(default_factory=dict)

    def clear(self) -> None:
        self.files.clear()
        self.orphans.clear()
        self.sizes.clear()

    # ---- image volumes (VM disks) ----------------------------------------------------------------
    def orphan_add(self, volid: str, node: str, size: int, dropped_by: int) -> None:
        """``volid`` stays on its storage although VM ``dropped_by`` no longer references it (an orphan
        unless another config still does)."""
        sid, _, volname = volid.partition(":")
        sdef = self.definition(sid)
        if any(vm for vm, v, _ in self.image_volumes(sid, node) if v == volid and vm is not None
               and vm.vmid != dropped_by):
            return  # another config still references it
        self.orphans.setdefault((sid, None if sdef.shared else node), {})[volname] = size

    def orphan_pop(self, volid: str, node: str) -> int | None:
        sid, _, volname = volid.partition(":")
        try:
            sdef = self.definition(sid)
        except PveError:
            return None
        return self.orphans.get((sid, None if sdef.shared else node), {}).pop(volname, None)

    def orphans_of(self, vmid: int, node: str) -> list[str]:
        """The orphaned volids owned by ``vmid`` (``vm-<vmid>-…``) that ``node`` sees."""
        out = []
        for (sid, n), vols in self.orphans.items():
            if n is not None and n != node:
                continue
            out += [f"{sid}:{name}" for name in vols if owner_of(name) == vmid]
        return sorted(out)

    def free_disk_name(self, sid: str, node: str, vmid: int, also: "list[str] | tuple[str, ...]" = ()) -> str:
        """pve-storage ``Plugin::find_free_diskname``: ``vm-<vmid>-disk-<n>``, the lowest ``n`` that no
        volume of the storage (as ``node`` sees it: configs and orphans) nor a name in ``also`` has."""
        used = set()
        for _, volid, _ in self.image_volumes(sid, node):
            used.add(volid.split(":", 1)[1])
        used |= {v.split(",", 1)[0].split(":", 1)[-1] for v in also}
        n = 0
        while f"vm-{vmid}-disk-{n}" in used:
            n += 1
        return f"vm-{vmid}-disk-{n}"

    def save(self) -> dict:
        """Everything, bytes included (base64), for the state file."""
        out = {(sid if node is None else f"{sid}@{node}"): {name: {"content": v.content, "format": v.format,
                                                                    "ctime": v.ctime,
                                                                    "data": base64.b64encode(v.data).decode()}
                                                             for name, v in b.items()}
                for (sid, node), b in self.files.items() if b}
        orphans = {(sid if node is None else f"{sid}@{node}"): dict(b) for (sid, node), b in self.orphans.items() if b}
        if orphans:
            out["@orphans"] = orphans
        if self.sizes:
            out["@sizes"] = dict(self.sizes)
        return out

    def load(self, d: dict) -> None:
        self.files.clear()
        self.orphans.clear()
        d = dict(d or {})
        self.sizes = {k: int(v) for k, v in (d.pop("@sizes", None) or {}).items()}
        for key, vols in (d.pop("@orphans", None) or {}).items():
            sid, _, node = key.partition("@")
            self.orphans[(sid, node or None)] = {name: int(size) for name, size in vols.items()}
        for key, vols in d.items():
            sid, _, node = key.partition("@")
            self.files[(sid, node or None)] = {
                name: Volume(f"{sid}:{name}", v["content"], v["format"], base64.b64decode(v["data"]), int(v["ctime"]))
                for name, v in vols.items()}

    def dump(self) -> dict:
        """``{"<storage>" or "<storage>@<node>": [volume...]}`` (admin state)."""
        out = {(sid if node is None else f"{sid}@{node}"): [v.to_json() for _, v in sorted(b.items())]
               for (sid, node), b in sorted(self.files.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
               if b}
        for (sid, node), b in sorted(self.orphans.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            if b:
                out.setdefault(sid if node is None else f"{sid}@{node}", []).extend(
                    {"volid": f"{sid}:{name}", "content": "images", "format": "raw", "size": size, "orphan": True}
                    for name, size in sorted(b.items()))
        return out

    def definition(self, sid: str) -> StorageDef:
        for s in STORAGES:
            if s.id == sid:
                return s
        raise PveError(500, f"storage '{sid}' does not exist")

    def _bucket(self, sid: str, node: str) -> dict[str, Volume]:
        sdef = self.definition(sid)
        return self.files.setdefault((sid, None if sdef.shared else node), {})

    def _path(self, sdef: StorageDef, volname: str) -> str:
        sub = {"iso": "template/iso", "vztmpl": "template/cache", "import": "import"}
        kind, _, name = volname.partition("/")
        return f"{sdef.path}/{sub.get(kind, kind)}/{name}"

    # ---- read ------------------------------------------------------------------------------------
    def volume(self, volid: str, node: str) -> Volume | None:
        """The volume ``<storage>:<volname>`` as node ``node`` sees it (None: it does not exist there)."""
        sid, sep, volname = volid.partition(":")
        if not sep:
            return None
        try:
            return self._bucket(sid, node).get(volname)
        except PveError:
            return None

    def image_volumes(self, sid: str, node: str, vmid: int | None = None, *, linked: bool = False):
        """``(vm, volid, size)`` of the VM image volumes on storage ``sid`` as node ``node`` sees it:
        its own VMs' on a node-local storage, every node's VMs' on a shared one — a template's
        ``base-<vmid>-disk-N`` among them (owned by the template: ``qm template`` renamed its disks,
        LvmThinPlugin.pm / RBDPlugin.pm create_base). ``linked``: also linked clones named after their
        base (``base-…/vm-…``, rbd); an lvmthin linked clone is an ordinary ``vm-…`` volume."""

        shared = self.definition(sid).shared
        for vm in sorted(self.cluster.vms.values(), key=lambda x: x.vmid):
            if (not shared and vm.node != node) or (vmid is not None and vmid != vm.vmid):
                continue
            for k, val in sorted(vm.config.items()):
                volid = val.split(",", 1)[0]
                if DISK_RE.fullmatch(k) and volid.startswith(f"{sid}:") and (linked or "/" not in volid):
                    m = re.search(r"(?:^|,)size=([^,]+)", val)
                    yield vm, volid, ((parse_size(m.group(1)) or 0) if m else self.sizes.get(volid, 4 * 1024 * 1024))
        for (osid, onode), vols in sorted(self.orphans.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            if osid != sid or (onode is not None and onode != node):
                continue
            for name, size in sorted(vols.items()):
                if vmid is None or owner_of(name) == vmid:
                    yield None, f"{sid}:{name}", size

    def used(self, sid: str, node: str) -> int:
        """What a storage's status reports used. A linked clone shares its base's blocks (a thin
        snapshot, an RBD clone): not counted again until it writes, which the model does not track."""
        sdef = self.definition(sid)
        if "images" in sdef.content and sdef.path is None:  # lvmthin, rbd: images only
            return sum(size for _, _, size in self.image_volumes(sid, node))
        return sum(v.size for v in self._bucket(sid, node).values())

    def list_storages(self, node: str, params: dict[str, str]) -> list[dict]:
        """``GET /nodes/{node}/storage`` (filters ``content``, ``storage``, ``enabled``, ``target``)."""
        self.cluster.check_node(node)
        from .schema import split_list

        want = set(split_list(params.get("content", "")))
        target = params.get("target")
        if target:
            self.cluster.check_node(target)
        out = []
        for s in STORAGES:
            if want and not want & set(s.content):
                continue
            if params.get("storage") and params["storage"] != s.id:
                continue
            if target and target != node and not s.shared:
                continue
            used = self.used(s.id, node)
            out.append({"storage": s.id, "type": s.type, "content": ",".join(s.content), "shared": int(s.shared),
                        "active": 1, "enabled": 1, "total": s.total, "used": used, "avail": s.total - used,
                        "used_fraction": used / s.total})
        return out

    def content(self, node: str, sid: str, params: dict[str, str]) -> list[dict]:
        """``GET …/storage/{storage}/content``: files, plus the VM disks of an ``images`` storage."""
        self.cluster.check_node(node)
        sdef = self.definition(sid)
        kind = params.get("content")
        vmid = params.get("vmid")
        out: list[dict] = []
        for volname, v in sorted(self._bucket(sid, node).items()):
            if kind and v.content != kind or vmid:
                continue
            out.append({"volid": v.volid, "content": v.content, "format": v.format, "size": v.size,
                        "ctime": v.ctime})
        if "images" in sdef.content and kind in (None, "images"):
            # pve-storage LvmThinPlugin.pm list_images: every LV named (vm|base)-<owner>-…, the
            # templates' base volumes too ({volid, format, size, vmid, ctime}); RBDPlugin.pm
            # list_images: a clone of a base image is listed as "<storage>:<base>/<name>" with its
            # rbd "parent" ("<base>@__base__") and "name" (rbd_ls's fields)
            seen: set[str] = set()
            for vm, volid, size in self.image_volumes(sid, node, int(vmid) if vmid else None, linked=True):
                if volid in seen:  # a volume two configs name (not modelled further)
                    continue
                seen.add(volid)
                owner = owner_of(volid.split(":", 1)[1])  # an orphan (vm None) is listed by its name's owner
                row = {"volid": volid, "content": "images", "format": "raw", "size": size,
                       "vmid": owner if owner is not None else (vm.vmid if vm else 0),
                       "ctime": int(vm.started_at or 0) if vm else 0}
                volname = volid.split(":", 1)[1]
                if sdef.type == "rbd":
                    base, _, name = volname.rpartition("/")
                    row["name"] = name
                    if base:
                        row["parent"] = f"{base}@__base__"
                out.append(row)
        return out

    # ---- upload ----------------------------------------------------------------------------------
    def check_upload(self, node: str, sid: str, params: dict[str, str], has_file: bool) -> tuple[StorageDef, str]:
        """The checks the upload handler makes before forking its worker; returns (storage, volname)."""
        self.cluster.check_node(node)
        sdef = self.definition(sid)
        if sdef.path is None:
            raise PveError(500, f"can't upload to storage type '{sdef.type}'")
        if not has_file:
            raise PveError(500, "missing temporary file name")
        content = params["content"]
        filename = normalize_filename(params["filename"])
        if content == "iso":
            if not ISO_EXT_RE.fullmatch(filename):
                raise param_error({"filename": "wrong file extension"})
        elif content == "vztmpl":
            if not VZTMPL_EXT_RE.fullmatch(filename):
                raise param_error({"filename": "wrong file extension"})
        elif content == "import":
            if not IMPORT_EXT_RE.fullmatch(filename):
                raise param_error({"filename": "wrong file extension"})
        else:  # pragma: no cover - the schema's enum refuses it first
            raise param_error({"content": f"upload content type '{content}' not allowed"})
        if content not in sdef.content:
            raise PveError(500, f"storage '{sid}' does not support '{content}' content")
        return sdef, f"{content}/{filename}"

    def upload(self, node: str, received_on: str, sid: str, params: dict[str, str], data: bytes | None,
               user: str, fail: str | None = None) -> str:
        """Check, then start the ``imgcopy`` task on the receiving node; returns its UPID."""
        sdef, volname = self.check_upload(node, sid, params, data is not None)
        assert data is not None
        tmp = f"/var/tmp/pveupload-{secrets.token_hex(16)}"
        dest = self._path(sdef, volname)
        content = params["content"]
        remote = node != received_on

        async def run(task: "Task") -> None:
            task.lines.append(f"starting file import from: {tmp}")
            algo, expect = params.get("checksum-algorithm"), params.get("checksum")
            await self.cluster.task_time("imgcopy")
            if algo:
                got = hashlib.new(algo, data).hexdigest()
                if got.lower() != (expect or "").lower():
                    task.lines.append("calculating checksum...")
                    raise PveError(500, f"checksum mismatch: got '{got}' != expect '{expect}'")
                task.lines.append("calculating checksum...OK, checksum verified")
            task.lines.append(f"target node: {node}")
            task.lines.append(f"target file: {dest}")
            task.lines.append(f"file size is: {len(data)}")
            if remote:
                ip = node_ip(self.cluster, node)
                task.lines.append(f"command: /usr/bin/scp -o BatchMode=yes -o HostKeyAlias={node} -o "
                                  f"UserKnownHostsFile=/etc/pve/nodes/{node}/ssh_known_hosts -o "
                                  f"GlobalKnownHostsFile=none -p -- {tmp} [{ip}]:{dest}")
            else:
                task.lines.append(f"command: cp -- {tmp} {dest}")
            self._bucket(sid, node)[volname] = Volume(f"{sid}:{volname}", content, "iso" if content == "iso"
                                                      else content, data, int(time.time()))
            task.lines.append("finished file import successfully")


        return self.cluster.spawn(received_on, "imgcopy", "", user, TaskPlan(run), fail)

    # ---- delete ----------------------------------------------------------------------------------
    async def delete(self, node: str, sid: str, volume: str, params: dict[str, str], user: str,
                     fail: str | None = None) -> str | None:
        """``DELETE …/content/{volume}`` (pve-storage ``Content.pm``): task ``imgdel`` with id = storage."""
        self.cluster.check_node(node)
        if ":" in volume:
            vsid, _, volname = volume.partition(":")
            if sid and vsid != sid:
                raise param_error({"volume": f"storage ID mismatch ({vsid} != {sid})\n"})
            sid = vsid
        else:
            volname = volume
        sdef = self.definition(sid)
        volid = f"{sid}:{volname}"
        check_volname(sdef, volname)
        orphan = sdef.path is None and volname in self.orphans.get((sid, None if sdef.shared else node), {})
        if sdef.path is None and not orphan:
            raise PveError(501, f"deleting the disk image '{volid}' is not implemented (z9 simulator)")

        async def run(task: "Task") -> None:
            await self.cluster.task_time("imgdel")
            if orphan:  # PVE::Storage::vdisk_free of an image no config references
                if self.orphan_pop(volid, node) is None:
                    raise PveError(500, f"no such logical volume {volid}")
                task.lines.append(f"  Logical volume \"{volname}\" successfully removed.")
                return
            bucket = self._bucket(sid, node)
            if volname in bucket:
                del bucket[volname]
            else:  # Plugin::free_image warns and returns: the task ends with WARNINGS
                task.warn(f"disk image '{self._path(sdef, volname)}' does not exist")
            task.lines.append(f"Removed volume '{volid}'")


        upid = self.cluster.spawn(node, "imgdel", sid, user, TaskPlan(run), fail)
        delay = params.get("delay")
        if delay:
            end = time.monotonic() + int(delay)
            task = self.cluster.tasks[upid]
            while task.status == "running" and time.monotonic() < end:
                await asyncio.sleep(0.05)
            if task.status == "stopped":
                if task.exitstatus == "OK" or (task.exitstatus or "").startswith("WARNINGS"):
                    return None
                raise PveError(500, task.exitstatus or "unexpected status")
        return upid
