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
privilege-separated token (added with ``POST /_sim/tokens``) starts with none.
"""

from __future__ import annotations

import re
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
    """``user@realm!name``; ``privsep``: its privileges are its ACL's (∩ its user's), else its user's."""

    tokenid: str
    secret: str
    privsep: bool = False
    acl: list[Acl] = field(default_factory=list)

    @property
    def user(self) -> str:
        return self.tokenid.split("!", 1)[0]


def privileges(token: Token | None, user: str, path: str) -> set[str]:
    """The privileges ``user`` (a ticket's user, or ``token``) holds on ``path``. Only root@pam is
    modelled as a user (every privilege everywhere); a token of root has root's unless privsep."""
    base = set(ADMIN_PRIVS) if (token.user if token else user) == "root@pam" else set()
    if token is None or not token.privsep:
        return base
    own: set[str] = set()
    for a in token.acl:
        if a.covers(path):
            own |= a.privs
    return base & own


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
        have = privileges(token, user, path)
        ok = any(p in have for p in privs) if "any" in expr[3:] else all(p in have for p in privs)
        return None if ok else f"Permission check failed ({path}, {', '.join(privs)})"
    if kind == "and":
        for sub in expr[1:]:
            if (msg := _eval(sub, token, user, params)) is not None:
                return msg
        return None
    if kind == "or":
        msgs = [_eval(sub, token, user, params) for sub in expr[1:]]
        return None if any(m is None for m in msgs) else "Permission check failed"
    return None  # userid-group, userid-param, perm-modify: not modelled
