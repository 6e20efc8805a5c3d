"""A minimal PVE permission model: API tokens, privilege separation and ACLs, checked against each
method's ``permissions`` in the shipped schema.

Sources: pve-access-control ``PVE/RPCEnvironment.pm`` (``check_api2_permissions``, ``check``,
``check_any``), ``PVE/AccessControl.pm`` (``roles``: the Administrator role's privileges, root@pam's
"all privileges everywhere", a token's privileges: those of its user, intersected with its own ACL
when it is privilege-separated) and ``API2/AccessControl.pm`` (``/access/permissions``).

- ``permissions: {user: world|all}``: anyone / any authenticated user.
- no ``permissions``: only ``root@pam`` itself (an API token of root is not ``root@pam``):
  ``Permission check failed (user != root@pam)``.
- ``check: [perm, <path>, [privs...], any?, 1?]``: every listed privilege (with ``any``: one) on the
  path (``{vmid}``, ``{node}``, ``{storage}``… replaced by the request's values): ``Permission check
  failed (<path>, <privs>)``; ``and`` / ``or`` combine checks. Other check kinds (``userid-group``,
  ``userid-param``, ``perm-modify``) are not modelled: allowed.
- An ACL entry on a path grants on that path and, propagated (the default), below it.

The simulator's own token (``root@pam!z9``) is not privilege-separated: it has every privilege. A
privilege-separated token (added with ``POST /_sim/tokens``) starts with none. A token of another
user (``z9@pve!z9``) holds what its user's ACL grants (``user_acl``), intersected with its own ACL
when privilege-separated. Beyond the schema's ``check``, the checks qemu-server makes in code where
z9 goes (:func:`check_config_keys`, :func:`check_drive`, the clone's storages and bridges, the resize's
storage, ``/cluster/resources`` showing only the VMs the caller may audit) are modelled in api.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import PveError

# pve-access-control PVE/AccessControl.pm: the privileges of the built-in Administrator role
ADMIN_PRIVS: tuple[str, ...] = (
    "Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.AllocateTemplate", "Datastore.Audit",
    "Group.Allocate", "Mapping.Audit", "Mapping.Modify", "Mapping.Use", "Permissions.Modify", "Pool.Allocate",
    "Pool.Audit", "Realm.Allocate", "Realm.AllocateUser", "SDN.Allocate", "SDN.Audit", "SDN.Use",
    "Sys.AccessNetwork", "Sys.Audit", "Sys.Console", "Sys.Incoming", "Sys.Modify", "Sys.PowerMgmt", "Sys.Syslog",
    "User.Modify", "VM.Allocate", "VM.Audit", "VM.Backup", "VM.Clone", "VM.Config.CDROM", "VM.Config.CPU",
    "VM.Config.Cloudinit", "VM.Config.Disk", "VM.Config.HWType", "VM.Config.Memory", "VM.Config.Network",
    "VM.Config.Options", "VM.Console", "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead",
    "VM.GuestAgent.FileSystemMgmt", "VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted", "VM.Migrate",
    "VM.PowerMgmt", "VM.Replicate", "VM.Snapshot", "VM.Snapshot.Rollback")


@dataclass
class Acl:
    path: str
    privs: frozenset[str]
    propagate: bool = True

    def covers(self, path: str) -> bool:
        if path == self.path:
            return True
        if not self.propagate:
            return False
        base = self.path.rstrip("/")
        return base == "" or path.startswith(base + "/")


@dataclass
class Token:
    """``user@realm!name``; ``privsep``: its privileges are its ACL's ∩ its user's, else its user's.
    ``user_acl``: the ACL of the token's user (a user other than root@pam holds only what it grants;
    ``pveum acl modify PATH --users USER --roles ROLE``), ``acl`` the token's own (``--tokens``)."""

    tokenid: str
    secret: str
    privsep: bool = False
    acl: list[Acl] = field(default_factory=list)
    user_acl: list[Acl] = field(default_factory=list)

    @property
    def user(self) -> str:
        return self.tokenid.split("!", 1)[0]


def _acl_privileges(acl: list[Acl], path: str) -> set[str]:
    """What one subject's ACL grants on ``path`` (pve-access-control PVE/RPCEnvironment.pm
    ``$compile_acl_path`` / AccessControl.pm ``roles``): walking from ``/`` down to ``path``, the
    entries of the deepest path that has any for the subject replace those inherited from above
    (a parent's only when they propagate; the path's own always)."""
    best: tuple[int, set[str]] | None = None
    for a in acl:
        if not a.covers(path):
            continue
        depth = len([x for x in a.path.split("/") if x])
        if best is None or depth > best[0]:
            best = (depth, set(a.privs))
        elif depth == best[0]:
            best[1].update(a.privs)
    return best[1] if best else set()


def privileges(token: Token | None, user: str, path: str) -> set[str]:
    """The privileges ``user`` (a ticket's user, or ``token``) holds on ``path``: root@pam every
    privilege everywhere (AccessControl.pm: ``return $cfg->{roles}->{'Administrator'}``), another
    user what its ACL grants; a token its user's — intersected with its own ACL when it is
    privilege-separated (RPCEnvironment.pm ``permissions``: ``$user_perms ∩ $token_perms``)."""
    owner = token.user if token else user
    base = set(ADMIN_PRIVS) if owner == "root@pam" else _acl_privileges(token.user_acl if token else [], path)
    if token is None or not token.privsep:
        return base
    return base & _acl_privileges(token.acl, path)


def require(token: Token | None, user: str, path: str, privs: list[str], any_of: bool = False) -> None:
    """RPCEnvironment.pm ``check`` (every privilege; the first missing one is named:
    ``Permission check failed (/vms/100, VM.Clone)``) or ``check_any`` (one of them; all named,
    joined by ``|``) — the 403 of ``raise_perm_exc`` (pve-common PVE/Exception.pm)."""
    if user == "root@pam":
        return
    have = privileges(token, user, path)
    if any_of:
        if not any(p in have for p in privs):
            raise PveError(403, f"Permission check failed ({path}, {'|'.join(privs)})")
        return
    for p in privs:
        if p not in have:
            raise PveError(403, f"Permission check failed ({path}, {p})")


# qemu-server src/PVE/API2/Qemu.pm (9.2): the option classes of $check_vm_modify_config_perm
CPU_OPTIONS = frozenset({"affinity", "cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets",
                         "vcpus"})
MEMORY_OPTIONS = frozenset({"memory", "balloon", "shares", "allow-ksm"})
HWTYPE_OPTIONS = frozenset({"acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet", "vga",
                            "watchdog", "audio0", "rng0"})
GENERAL_OPTIONS = frozenset({"agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime",
                             "migrate_speed", "name", "onboot", "ostype", "protection", "reboot", "startdate",
                             "startup", "tdf", "template"})
POWER_OPTIONS = frozenset({"freeze"})
ROOT_ONLY = frozenset({"args", "lock", "hookscript"})
DISK_OPTIONS = frozenset({"boot", "bootdisk", "vmstatestorage"})
CLOUDINIT_OPTIONS = frozenset({"cicustom", "cipassword", "citype", "ciuser", "ciupgrade", "nameserver",
                               "searchdomain", "sshkeys"})
_DRIVE = re.compile(r"(ide|sata|scsi|virtio|efidisk|tpmstate)\d+")


def check_config_keys(token: Token | None, user: str, vmid: int, keys: list[str], *, create: bool = False) -> None:
    """``$check_vm_modify_config_perm`` (qemu-server API2/Qemu.pm), for the keys a config write
    sets or deletes: CPU, memory, hardware, general (name, description, protection, agent…),
    disk-order, network (``netN``) and cloud-init keys (``ipconfigN``, sshkeys…: VM.Config.Cloudinit
    or VM.Config.Network) each need their privilege on ``/vms/<vmid>``; ``tags`` need
    VM.Config.Options (pve-guest-common GuestHelpers.pm ``assert_tag_permissions``, under the
    default ``user-tag-access: free``); drives are checked by :func:`check_drive`; ``args``,
    ``lock``, ``hookscript``: ``only root can set '<key>' config`` (HTTP 500, as PVE's die).
    ``create`` (create_vm, which hands it exactly the config keys): every key of no class is
    root's alone (the ``else`` branch, "catches args, lock, etc."), and ``tags`` are left to
    :func:`check_create` (create_vm's assert_tag_permissions)."""
    if user == "root@pam":
        return
    path = f"/vms/{vmid}"
    for k in keys:
        if _DRIVE.fullmatch(k) or k == "cdrom" or re.fullmatch(r"(unused|serial|usb|hostpci|virtiofs)\d+", k):
            continue
        if k == "tags":
            if not create:
                require(token, user, path, ["VM.Config.Options"])
        elif k in CPU_OPTIONS or re.fullmatch(r"numa\d+", k):
            require(token, user, path, ["VM.Config.CPU"])
        elif k in MEMORY_OPTIONS:
            require(token, user, path, ["VM.Config.Memory"])
        elif k in HWTYPE_OPTIONS:
            require(token, user, path, ["VM.Config.HWType"])
        elif k in GENERAL_OPTIONS:
            require(token, user, path, ["VM.Config.Options"])
            if k == "startup":
                require(token, user, "/", ["Sys.Modify"])
        elif k in DISK_OPTIONS:
            require(token, user, path, ["VM.Config.Disk"])
        elif re.fullmatch(r"net\d+", k):
            require(token, user, path, ["VM.Config.Network"])
        elif k in CLOUDINIT_OPTIONS or re.fullmatch(r"ipconfig\d+", k):
            require(token, user, path, ["VM.Config.Cloudinit", "VM.Config.Network"], any_of=True)
        elif k in POWER_OPTIONS:
            require(token, user, path, ["VM.PowerMgmt"])
        elif k == "vmstate":
            require(token, user, path, ["VM.Config.Disk", "VM.PowerMgmt"])
        elif k in ROOT_ONLY or create:
            raise PveError(500, f"only root can set '{k}' config")
        # (other keys — rng0, audio0, hugepages… — have checks of their own there: not modelled, allowed)


def check_drive(token: Token | None, user: str, vmid: int, value: str) -> None:
    """A drive a config write sets or deletes (qemu-server API2/Qemu.pm ``$check_drive_param`` and the
    delete loop of ``$update_vm_api``): a CD-ROM (a cloud-init drive is one) needs VM.Config.CDROM,
    a disk VM.Config.Disk, on ``/vms/<vmid>``."""
    if user == "root@pam":
        return
    cdrom = "media=cdrom" in value or "cloudinit" in value.split(",", 1)[0]
    require(token, user, f"/vms/{vmid}", ["VM.Config.CDROM" if cdrom else "VM.Config.Disk"])


# create_vm's own parameters, extracted before any check (qemu-server API2/Qemu.pm create_vm)
CREATE_PARAMS = frozenset({"node", "vmid", "archive", "bwlimit", "force", "pool", "start", "ha-managed", "storage",
                           "unique", "live-restore", "import-working-storage"})


def check_create(token: Token | None, user: str, params: dict, volume_owner: Callable[[str], tuple[str, int | None]]) -> None:
    """qemu-server API2/Qemu.pm ``create_vm`` (its schema: ``user => 'all', # check inside``), in its
    order, before anything is created: ``storage`` (the default storage) Datastore.AllocateSpace;
    ``start`` VM.PowerMgmt; VM.Allocate on ``/vms/<vmid>`` (else ``raise_perm_exc()``: "Permission
    check failed"); ``$check_storage_access`` per drive (a new disk ``<storage>:<size>``: that
    storage's — or the default's — Datastore.AllocateSpace; ``none``/cloud-init: nothing; an
    existing volume: pve-storage ``check_volume_access`` — an ISO Datastore.AllocateSpace or
    Datastore.Audit, a volume of this vmid nothing, another Datastore.Allocate); then
    ``$check_vm_modify_config_perm`` over the config keys; ``check_bridge_access`` (QemuServer.pm:
    SDN.Use on each NIC's bridge, sorted); and in the create worker, before the config is written,
    ``assert_tag_permissions`` (pve-guest-common GuestHelpers.pm: new tags need VM.Config.Options
    under the default ``user-tag-access: free``). ``volume_owner(volid)`` is ``(vtype, owner vmid)``
    of an existing volume (pve-storage ``parse_volname``)."""
    if user == "root@pam":
        return
    vmid = int(params["vmid"])
    path = f"/vms/{vmid}"
    default_storage = params.get("storage")
    if default_storage is not None:
        require(token, user, f"/storage/{default_storage}", ["Datastore.AllocateSpace"])
    if params.get("ha-managed") not in (None, 0, "0"):
        require(token, user, "/", ["Sys.Console"])
    if params.get("start") not in (None, 0, "0"):
        require(token, user, path, ["VM.PowerMgmt"])
    if "VM.Allocate" not in privileges(token, user, path):
        raise PveError(403, "Permission check failed")
    conf = {k: v for k, v in params.items() if k not in CREATE_PARAMS and not str(k).startswith("@")}
    for k in sorted(conf):  # $check_storage_access ($foreach_volume_with_alloc: sorted keys)
        if not (_DRIVE.fullmatch(k) or k == "cdrom"):
            continue
        value = str(conf[k])
        volid = value.split(",", 1)[0].removeprefix("file=")
        cdrom = "media=cdrom" in value or k == "cdrom"
        sid, _, volname = volid.partition(":")
        if volid in ("", "none", "cloudinit") or volname == "cloudinit" or volname.endswith("-cloudinit"):
            continue
        if cdrom and volid == "cdrom":
            require(token, user, "/", ["Sys.Console"])
        elif not cdrom and re.fullmatch(r"(?:([^:\s]+):)?(\d+(?:\.\d+)?)", volid):
            m = re.fullmatch(r"(?:([^:\s]+):)?(\d+(?:\.\d+)?)", volid)
            storeid = (m.group(1) if m else None) or default_storage
            if not storeid:
                raise PveError(500, "no storage ID specified (and no default storage)")
            require(token, user, f"/storage/{storeid}", ["Datastore.AllocateSpace"])
        elif not volname:
            raise PveError(500, "Only root can pass arbitrary filesystem paths.")
        else:  # pve-storage PVE/Storage.pm check_volume_access
            if "Datastore.Allocate" in privileges(token, user, f"/storage/{sid}"):
                continue
            vtype, owner = volume_owner(volid)
            if vtype in ("iso", "vztmpl"):
                require(token, user, f"/storage/{sid}", ["Datastore.AllocateSpace", "Datastore.Audit"], any_of=True)
            elif owner is not None and owner == vmid:
                continue
            else:
                require(token, user, f"/storage/{sid}", ["Datastore.Allocate"])
    check_config_keys(token, user, vmid, sorted(conf), create=True)
    for k in sorted(conf):
        if re.fullmatch(r"net\d+", k) and (bridge := bridge_path(str(conf[k]))):
            require(token, user, bridge, ["SDN.Use"])
    if conf.get("tags"):
        require(token, user, path, ["VM.Config.Options"])


def _no_vnets(bridge: str) -> str | None:
    return None


def bridge_path(net: str, vnet_zone: Callable[[str], "str | None"] = _no_vnets) -> str | None:
    """The SDN path a NIC's bridge is checked on (qemu-server QemuServer.pm ``check_bridge_access`` →
    pve-guest-common GuestHelpers.pm ``check_vnet_access``: a VNet is checked on its zone,
    ``/sdn/zones/<zone>/<vnet>``; a plain Linux bridge is a vnet of zone ``localnetwork``):
    None without a bridge."""
    m = re.search(r"(?:^|,)bridge=([^,]+)", net)
    if not m:
        return None
    return f"/sdn/zones/{vnet_zone(m.group(1)) or 'localnetwork'}/{m.group(1)}"


def _fill(path: str, params: dict) -> str:
    return re.sub(r"\{([^}]+)\}", lambda m: str(params.get(m.group(1), m.group(0))), path)


def check(perms: dict | None, token: Token | None, user: str, params: dict) -> None:
    """Raise 403 when ``user``/``token`` may not call a method with schema ``perms``."""
    if perms is not None and perms.get("user") in ("world", "all"):
        return
    if perms is None or "check" not in perms:
        if user != "root@pam":
            raise PveError(403, "Permission check failed (user != root@pam)")
        return
    failed = _eval(perms["check"], token, user, params)
    if failed is not None:
        raise PveError(403, failed)


def _eval(expr: list, token: Token | None, user: str, params: dict) -> str | None:
    """None when ``expr`` holds, else the failure message (RPCEnvironment.pm check / check_any)."""
    kind = expr[0]
    if kind == "perm":
        path, privs = _fill(expr[1], params), list(expr[2])
        if "require_param" in expr[3:]:
            # ['perm', '/pool/{pool}', [...], 'require_param', 'pool']: only when the parameter is given
            name = expr[expr.index("require_param") + 1]
            if name not in params:
                return "Permission check failed"
        if user == "root@pam":
            return None
        have = privileges(token, user, path)
        if "any" in expr[3:]:
            return None if any(p in have for p in privs) else f"Permission check failed ({path}, {'|'.join(privs)})"
        missing = [p for p in privs if p not in have]
        return None if not missing else f"Permission check failed ({path}, {missing[0]})"
    if kind == "and":
        for sub in expr[1:]:
            if (msg := _eval(sub, token, user, params)) is not None:
                return msg
        return None
    if kind == "or":
        # RPCEnvironment.pm check_api2_permissions: the first alternative's failure is the answer
        msgs = [_eval(sub, token, user, params) for sub in expr[1:]]
        return None if any(m is None for m in msgs) else (msgs[0] or "Permission check failed")
    return None  # userid-group, userid-param, perm-modify: not modelled
