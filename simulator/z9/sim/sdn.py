"""Proxmox VE SDN as z9 calls it: zones and VNets, the pending and the running configuration, the
cluster-wide apply with its global lock, and each node's view of the zones.

Sources (pve-network, ``src/PVE/``; research ``networks-firewalls.md`` §1.5):

- ids: ``Zones/Plugin.pm`` and ``VnetPlugin.pm`` — pattern ``[a-zA-Z][a-zA-Z0-9]*[a-zA-Z0-9]``,
  ``maxLength 8`` (the schema shipped with the simulator checks both before a handler runs).
- ``API2/Network/SDN/Zones.pm`` create: ``sdn zone object ID '<id>' already defined``; VXLAN
  ``Zones/VxlanPlugin.pm`` on_update_hook: ``peers``/``fabric`` "must have exactly one of peers /
  fabric defined"; delete of a zone a VNet still names: ``Zones/Plugin.pm`` on_delete_hook ``zone <z>
  is used by vnet <v>``.
- ``API2/Network/SDN/Vnets.pm`` create: ``sdn vnet object ID '<id>' already defined``;
  ``VxlanPlugin.pm`` vnet_update_hook: ``missing vxlan tag``, ``vxlan tag max value is 16777216``,
  ``vxlan tag <t> already exist in vnet <id> in zone <z> `` (VNIs unique across every VXLAN/EVPN
  zone); ``SimplePlugin.pm``: ``vlan tag is not allowed on simple zone``.
- Every write goes through ``SDN.pm`` ``lock_sdn_config`` (under ``cfs_lock_domain("sdn")``): while
  ``/etc/pve/sdn/.lock`` exists, a request without that exact ``lock-token`` dies
  ``invalid lock token provided!``, prefixed by the handler's message ("create sdn vnet object
  failed: …", "could not commit SDN config: …", "could not acquire lock for SDN config: …", "could
  not release lock: …"). ``POST /cluster/sdn/lock`` (PVE 9) refuses with ``configuration has pending
  changes`` unless ``allow-pending``; the token is a UUIDv7 and **never expires**. ``DELETE`` takes the
  token or ``force=1``.
- Writes change only the pending configuration; ``GET …?pending=1`` gives each object's ``state``
  ``new|changed|deleted`` and its ``pending`` keys (``SDN.pm`` pending_config); ``?running=1`` the
  last committed one. ``PUT /cluster/sdn`` (``API2/Network/SDN.pm`` reload) commits *everything*
  pending (``commit_config``: ``version++``), releases the lock when asked (``release-lock``, default
  1), and forks a ``reloadnetworkall`` worker that starts one ``srvreload`` task per node (``pvesh set
  /nodes/<n>/network``); a node's failure is only ``warn``ed — "FIXME: … monitor the tasks" —: the
  apply task ends OK while a node failed.
- A node's ``GET /nodes/{n}/sdn/zones`` (``API2/Network/SDN/Nodes/Zones.pm``, ``Zones.pm`` status):
  ``available`` when its local network config is at the running version, ``pending`` when it lags
  ("local sdn network configuration is too old, please reload"). A VNet exists as a bridge on a node
  only once that node reloaded a config holding it.

The admin fault :meth:`Sdn.fail_reload` makes a node's reload fail (``ifreload -a`` exits 1, as on a
node whose uplink config is broken) until it is cleared.
"""
from __future__ import annotations

import copy
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from .errors import PveError

VXLAN_TYPES = ("vxlan", "evpn")
_BOOL = ("isolate-ports", "vlanaware")


def _uuid7() -> str:
    """A UUIDv7 (``SDN.pm`` generate_lock_token: ``UUID::generate_v7``)."""
    ms = int(time.time() * 1000)
    rnd = uuid.uuid4().int & ((1 << 74) - 1)
    value = (ms << 80) | (0x7 << 76) | ((rnd >> 62) << 64) | (0b10 << 62) | (rnd & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


def _param_exc(key: str, text: str) -> str:
    """A ``raise_param_exc`` inside lock_sdn_domain, re-died as ``"$errmsg: $err"``: the
    exception's message, its field on the next line (PVE::Exception stringification)."""
    return f"Parameter verification failed.\n{key}: {text}"


class Sdn:
    """The cluster's SDN configuration (``/etc/pve/sdn``) and each node's applied copy."""

    def __init__(self, nodes: list[str]):
        self.nodes = list(nodes)
        self.clear()

    def clear(self) -> None:
        self.zones: dict[str, dict[str, Any]] = {}
        self.vnets: dict[str, dict[str, Any]] = {}
        self.running: dict[str, Any] = {"version": 0, "zones": {}, "vnets": {}}
        self.lock_token: str | None = None
        self.local: dict[str, dict[str, Any]] = {n: {"version": 0, "zones": {}, "vnets": {}} for n in self.nodes}
        self.failing: dict[str, str] = {}  # node -> why its reload fails (admin fault)
        self.applies = 0

    # ---- the lock (SDN.pm lock_sdn_config) -------------------------------------------------------------
    def _locked(self, token: str | None, errmsg: str) -> None:
        if self.lock_token is not None and token != self.lock_token:
            raise PveError(500, f"{errmsg}: invalid lock token provided!")

    def lock(self, allow_pending: bool) -> str:
        self._locked(None, "could not acquire lock for SDN config")
        if not allow_pending and self.has_pending():
            raise PveError(500, "could not acquire lock for SDN config: configuration has pending changes")
        self.lock_token = _uuid7()
        return self.lock_token

    def unlock(self, token: str | None, force: bool) -> None:
        if not force:
            self._locked(token, "could not release lock")
        self.lock_token = None

    # ---- zones ------------------------------------------------------------------------------------------
    def zone_create(self, p: dict[str, str]) -> None:
        zid, ztype = p["zone"], p["type"]
        opts = {k: v for k, v in p.items() if k not in ("zone", "lock-token")}
        if ztype == "vxlan" and bool(opts.get("peers")) == bool(opts.get("fabric")):
            # VxlanPlugin.pm on_update_hook (checked before the lock in check_config's hooks)
            raise PveError(400, "Parameter verification failed.", {
                "peers": "must have exactly one of peers / fabric defined",
                "fabric": "must have exactly one of peers / fabric defined"})
        self._locked(p.get("lock-token"), "create sdn zone object failed")
        if zid in self.zones:
            raise PveError(500, f"create sdn zone object failed: sdn zone object ID '{zid}' already defined")
        self.zones[zid] = opts

    def zone_delete(self, zid: str, token: str | None) -> None:
        self._locked(token, "delete sdn zone object failed")
        if zid not in self.zones:
            # Zones.pm sdn_zones_config
            raise PveError(500, f"delete sdn zone object failed: sdn '{zid}' does not exist")
        users = sorted(v for v, c in self.vnets.items() if c.get("zone") == zid)
        if users:  # Zones/Plugin.pm on_delete_hook: a zone a VNet names cannot go
            raise PveError(500, f"delete sdn zone object failed: zone {zid} is used by vnet {users[0]}")
        del self.zones[zid]

    # ---- vnets ------------------------------------------------------------------------------------------
    def vnet_create(self, p: dict[str, str]) -> None:
        vid = p["vnet"]
        opts = {k: v for k, v in p.items() if k not in ("vnet", "lock-token")}
        opts.setdefault("type", "vnet")
        self._locked(p.get("lock-token"), "create sdn vnet object failed")
        if vid in self.vnets:
            raise PveError(500, f"create sdn vnet object failed: sdn vnet object ID '{vid}' already defined")
        self._vnet_hook(vid, opts, "create sdn vnet object failed")
        self.vnets[vid] = opts

    def _vnet_hook(self, vid: str, opts: dict[str, Any], errmsg: str) -> None:
        """The zone plugin's ``vnet_update_hook``."""
        zone = self.zones.get(str(opts.get("zone")))
        ztype = (zone or {}).get("type")
        tag = opts.get("tag")
        if ztype in VXLAN_TYPES:
            if tag is None:
                raise PveError(500, f"{errmsg}: {_param_exc('tag', 'missing vxlan tag')}")
            if int(tag) > 16777216:
                raise PveError(500, f"{errmsg}: {_param_exc('tag', 'vxlan tag max value is 16777216')}")
            for other in sorted(self.vnets):
                o = self.vnets[other]
                if other == vid or (self.zones.get(str(o.get("zone"))) or {}).get("type") not in VXLAN_TYPES:
                    continue
                if o.get("tag") is not None and str(o["tag"]) == str(tag):
                    raise PveError(500, f"{errmsg}: " + _param_exc(
                        "tag", f"vxlan tag {tag} already exist in vnet {other} in zone {o.get('zone')} "))
        elif ztype == "simple" and tag is not None:
            raise PveError(500, f"{errmsg}: {_param_exc('tag', 'vlan tag is not allowed on simple zone')}")

    def vnet_delete(self, vid: str, token: str | None) -> None:
        self._locked(token, "delete sdn vnet object failed")
        if vid not in self.vnets:
            # Vnets.pm sdn_vnets_config
            raise PveError(500, f"delete sdn vnet object failed: sdn vnet '{vid}' does not exist")
        del self.vnets[vid]

    def vnet_zone(self, vid: str) -> str | None:
        """The zone a VNet names (pending config first, else running): for SDN.Use's path."""
        v = self.vnets.get(vid) or self.running["vnets"].get(vid)
        return str(v["zone"]) if v and v.get("zone") else None

    # ---- listings (pending_config) -------------------------------------------------------------------
    def _objects(self, kind: str, key: str, pending: bool, running: bool) -> list[dict[str, Any]]:
        cur: dict[str, dict[str, Any]] = getattr(self, kind)
        run: dict[str, dict[str, Any]] = self.running[kind]
        if running:
            return [{key: i, **_typed(o)} for i, o in sorted(run.items())]
        if not pending:
            return [{key: i, **_typed(o)} for i, o in sorted(cur.items())]
        out = []
        for i in sorted(set(cur) | set(run)):
            c, r = cur.get(i), run.get(i)
            row: dict[str, Any] = {key: i}
            if c is None:
                row.update(_typed(r or {}), state="deleted")
            else:
                row.update({k: v for k, v in _typed(r or {}).items()})
                changed = {k: v for k, v in _typed(c).items() if k not in ("type",) and (r or {}).get(k) != c.get(k)}
                if key == "zone" or key == "vnet":
                    row["type"] = c.get("type")
                if r is None:
                    row["state"], row["pending"] = "new", changed
                elif changed or any(k not in c for k in r):
                    row["state"] = "changed"
                    row["pending"] = {**changed, **{k: "deleted" for k in r if k not in c}}
            out.append(row)
        return out

    def zones_list(self, pending: bool = False, running: bool = False) -> list[dict[str, Any]]:
        return self._objects("zones", "zone", pending, running)

    def vnets_list(self, pending: bool = False, running: bool = False) -> list[dict[str, Any]]:
        return self._objects("vnets", "vnet", pending, running)

    def has_pending(self) -> bool:
        return self.zones != self.running["zones"] or self.vnets != self.running["vnets"]

    # ---- apply ----------------------------------------------------------------------------------------
    def commit(self, token: str | None, release: bool) -> None:
        """``PUT /cluster/sdn``'s first half (under the lock): the running config becomes the pending one."""
        self._locked(token, "could not commit SDN config")
        self.running = {"version": int(self.running["version"]) + 1, "zones": copy.deepcopy(self.zones),
                        "vnets": copy.deepcopy(self.vnets)}
        self.applies += 1
        if token and release:
            self.lock_token = None

    def reload_node(self, node: str) -> None:
        """``srvreload`` on ``node`` (``ifreload -a`` with the generated ``/etc/network/interfaces.d/sdn``)."""
        why = self.failing.get(node)
        if why is not None:
            raise PveError(500, why)
        self.local[node] = copy.deepcopy(self.running)

    def fail_reload(self, node: str, fail: bool) -> None:
        if fail:
            self.failing[node] = "command 'ifreload -a' failed: exit code 1"
        else:
            self.failing.pop(node, None)

    def node_zones(self, node: str) -> list[dict[str, Any]]:
        """``GET /nodes/{node}/sdn/zones`` (``Zones.pm`` status)."""
        run = self.running
        if not run["version"]:
            return []
        local = self.local.get(node) or {"version": 0}
        status = "available" if int(local["version"]) >= int(run["version"]) else "pending"
        out = []
        for zid, z in sorted(run["zones"].items()):
            nodes = [n for n in re.split(r"[,;\s]+", str(z.get("nodes") or "")) if n]
            if nodes and node not in nodes:
                continue
            out.append({"zone": zid, "status": status})
        return out

    def bridges(self, node: str) -> dict[str, dict[str, Any]]:
        """The VNet bridges ``node`` has (its last successful reload): vnet -> its config."""
        local = self.local.get(node) or {"vnets": {}, "zones": {}}
        out = {}
        for vid, v in local["vnets"].items():
            z = local["zones"].get(str(v.get("zone"))) or {}
            nodes = [n for n in re.split(r"[,;\s]+", str(z.get("nodes") or "")) if n]
            if not nodes or node in nodes:
                out[vid] = {**v, "zone-type": z.get("type"), "mtu": zone_mtu(z)}
        return out

    def dump(self) -> dict[str, Any]:
        return {"zones": self.zones, "vnets": self.vnets, "running": self.running, "lock": self.lock_token,
                "local": self.local, "failing": self.failing, "applies": self.applies}


def zone_mtu(zone: dict[str, Any]) -> int:
    """``VxlanPlugin.pm`` generate_sdn_config: 1450 (the uplink's 1500 − 50), or the zone's ``mtu``."""
    if zone.get("mtu"):
        return int(zone["mtu"])
    return 1450 if zone.get("type") in VXLAN_TYPES else 1500


def _typed(o: dict[str, Any]) -> dict[str, Any]:
    """A section's values as PVE's JSON gives them (integers and booleans as numbers)."""
    out: dict[str, Any] = {}
    for k, v in o.items():
        if k in ("tag", "mtu", "vxlan-port") and re.fullmatch(r"\d+", str(v)):
            out[k] = int(v)
        elif k in _BOOL:
            out[k] = 1 if str(v) in ("1", "true") else 0
        else:
            out[k] = v
    return out


Resolver = Callable[[str], "str | None"]
