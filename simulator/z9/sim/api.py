"""aiohttp application of the simulator: the PVE API under ``/api2/json`` and the admin API ``/_sim``.

PVE request pipeline, in pve-http-server's order (facts: Transport and auth, Envelope and errors):

1. auth: ``Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET`` (split at the last ``=``) or the
   ``PVEAuthCookie`` ticket from ``POST /access/ticket`` (+ ``CSRFPreventionToken`` header on non-GET).
   None → 401 ``No ticket``; wrong → 401 ``Authentication failed!`` (each after ``auth_delay_s``, real PVE: 3).
2. schema (:mod:`z9.sim.schema`): unknown path/method → 501 ``Method 'GET /x' not implemented``;
   parameter errors → 400 ``Parameter verification failed.`` with ``errors``.
3. faults (:mod:`z9.sim.faults`), then the handler.

Parameters come from the query string and, for POST/PUT, from a form-encoded (proxmoxer), JSON or
(upload only) multipart body; array parameters (``agent/exec``'s ``command``) collect repeated fields.
A non-upload POST/PUT body over 512 KiB → 501 ``for data too large`` (pve-http-server, before anything);
an upload that is not ``multipart/form-data`` → 501 ``upload 'Content-Type '<ct>' not implemented``, one
without ``Content-Length`` (chunked) → 501 ``upload without content length header not supported``.
Answers over 1 KiB are gzipped when the client sends ``Accept-Encoding: gzip`` (pve-http-server does;
proxmoxer/requests and aiohttp decode it transparently).
Success: ``{"data": ...}``. Error: reason phrase = first line of the message, body
``{"data": null, "message": "<msg>\\n"[, "errors": {...}]}`` (PVE >= 9).

Endpoints with a handler (everything else in the schema answers 501 ``… not implemented (z9 simulator)``):
version, nodes, cluster resources/nextid, qemu list/create/config/clone/destroy/resize/status/power,
tasks; firewall (:mod:`z9.sim.firewall`): ``/nodes/{n}/qemu/{vmid}/firewall`` index, ``options``
GET/PUT, ``ipset`` GET/POST, ``ipset/{name}`` GET/POST/DELETE, ``ipset/{name}/{cidr}`` GET/PUT/DELETE, ``rules``
GET/POST, ``rules/{pos}`` GET/PUT/DELETE,
``/cluster/firewall/options`` GET/PUT, ``/cluster/firewall/ipset[/{name}[/{cidr}]]`` (cluster IP sets); cloud-init (:mod:`z9.sim.cloudinit`): ``…/cloudinit`` GET/PUT,
``…/cloudinit/dump``; storage (:mod:`z9.sim.storage`): ``/nodes/{n}/storage``, ``…/{storage}`` index,
``status``, ``content`` GET, ``content/{volume}`` GET/DELETE, ``upload``; guest agent
(:mod:`z9.sim.guest`): ``agent`` index, POST ``agent`` (command=ping|get-osinfo|…), ``ping``,
``get-osinfo``, ``network-get-interfaces``, ``get-host-name``, ``info``, ``exec``, ``exec-status``,
``file-read``, ``file-write``.

Admin API (no auth, loopback peers only), JSON in and out:

- ``POST /_sim/faults`` body :class:`z9.sim.faults.FaultSpec` → ``{"id": n}``; ``GET /_sim/faults`` →
  ``[{id, method, path, action, status, reason, seconds, exitstatus, times, probability, remaining,
  hits}]``; ``DELETE /_sim/faults`` → ``{"deleted": n}``; ``DELETE /_sim/faults/{id}`` → ``{"deleted": 1}``
  or 404.
- ``POST /_sim/reset`` → ``{"ok": true}``: seeded VMs back, tasks, faults and counters cleared.
- ``GET /_sim/counters`` → the ``counters`` of ``/_sim/state`` alone (cheap at any size).
- ``GET /_sim/requests[?lease=<text>]`` → ``[{at, method, path, status, lease}]``: the request log (the
  latest :data:`REQUEST_LOG_MAX`, oldest first; ``at`` the epoch time the request came in, ``lease``
  its ``X-Z9-Lease`` header — the fencing token z9 sends with a job's calls — or null); with ``lease``,
  only the requests whose token contains that text. Cleared by a reset.
- ``GET /_sim/state`` → ``{"vms": [{vmid, node, config, running, template, lock}], "tasks": [{upid, node,
  type, id, user, status, exitstatus, starttime, endtime, log: [str]}], "counters": {"requests":
  [{method, path, status, count}], "tasks_started": {type: n}}, "stats_refreshed_at": unix_s,
  "firewall": {"vms": {"<vmid>": {options, ipsets: {name: [{cidr, comment?, nomatch?}]}, comments}},
  "cluster_options": {}}, "node_ports": {node: port}}`` (each node's own API listener, see
  :class:`z9.sim.server.SimServer`).
- ``POST /_sim/stats/refresh`` → ``{"ok": true}`` (refresh the ``/cluster/resources`` stats cache now).
- ``POST /_sim/vms`` ``{vmid, node, config: {k: v}, running}`` → the VM (upsert) — a VM changed out of
  band, e.g. a foreign VM with its own ``ipconfig0``: its cloud-init keys count as applied and, when
  running, it booted from the drive they generate; a disk an upsert no longer names stays on its storage
  (the config file edited by hand: an image of the vmid no config references);
  ``DELETE /_sim/vms/{vmid}`` → ``{"deleted": 1}``.
  ``guest`` (optional, ``{files?: {path: base64}, models?: {...}}``): the VM's guest disk state — a
  template's image content, which its clones inherit with the disk (``{"models": {"appliance":
  {"nic_names": "predictable"}}}``: the load balancer appliance image, :mod:`z9.sim.appliance`).
- ``POST /_sim/flock`` ``{vmid, seconds}`` → ``{"ok": true}``: hold the VM's config flock (lock contention).
- ``POST /_sim/tasks/hold`` ``{type}`` → ``{"ok": true}``: workers of that task type (``qmclone``...) do
  not end, past their duration, until ``POST /_sim/tasks/release`` ``{type?}`` (none: every type) or a
  reset — a test sees a task's in-between state (its lock) without racing the task's duration.
- ``GET /_sim/k8s/clusters`` → the kubeadm model's clusters; ``POST /_sim/k8s/expire-tokens`` → every
  bootstrap token expires now (fault), see :mod:`z9.sim.kubeadm`.
- ``POST /_sim/tokens`` ``{tokenid, privsep?, acl?: [{path, privs, propagate?}], user_acl?: [...]}`` →
  ``{tokenid, value}``: an API token (privilege-separated by default) for the permission model
  (z9.sim.permissions); ``user_acl`` is its user's ACL (root@pam holds every privilege without one).
- ``PUT /_sim/config`` ``{task_seconds?, task_default_s?, stats_lag_s?, task_invisible_s?, auth_delay_s?,
  guest_boot_s?, cloud_init_s?, k8s_api_delay_s?, agent_timeout_s?, clone_race?, firewall_clock?: "manual"|"real"}``
  → the current values (changes timing at run time; ``agent_timeout_s``: how long a silent guest agent is waited
  for, PVE's 3 s);
  400 on an unknown key or a bad value, and then nothing is applied.
- ``GET /_sim/guests/{vmid}`` → the guest (:meth:`z9.sim.guest.Guest.to_json`: ``powered``, ``booted``,
  ``boots``, ``instance_id``, ``host_key`` (SSH host key fingerprint), ``hostname``, ``cloud_init``
  ``{status, errors, datasource}``, ``agent``, ``files`` (paths), ``nameservers`` (its resolv.conf's),
  ``interfaces``, ``extra_addresses``,
  ``models``, ``inputs.source`` (the CD-ROM cloud-init read)); 404 when the VM never started (nor was cloned from one that did) or is gone.
  ``GET /_sim/state`` has ``"guests": {"<vmid>": summary}`` and ``"storage": {"local@pve1": [{volid,
  content, format, size, ctime, sha256}], "isos": [...]}``.
- ``GET /_sim/firewall/deliver?src=&dst=&proto=&port=&sport=`` → ``{delivered, reason, src_vmid, dst_vmid,
  rejected, steps}``: would the first packet of a new connection from ``src`` (an address — a guest's, or any other:
  "outside" — or a vmid) to ``dst`` (a vmid, or an address a running guest holds), ``proto`` (a name or
  number of /etc/protocols; default tcp), destination ``port`` be delivered, by what pve-firewall last
  compiled (:func:`z9.sim.firewall.deliver`)? ``reason`` names the VM, NIC, direction and the rule or
  policy that decided; 400 for a malformed question.
- ``GET``/``POST /_sim/firewall/clock`` ``{advance?: seconds, next_cycle?: true}`` → ``{now, manual, cycle,
  compiled_at, next_cycle_in}``: the clock of pve-firewall's 10 s compile cycle (a write through the API
  is enforced from the next cycle on); ``SimConfig.firewall_clock="manual"`` (the tests') moves only here.
- ``POST /_sim/guests/{vmid}/addresses`` ``{iface: "eth0", address: "203.0.113.7/32"}`` → ``{interfaces}``:
  configure an address inside a booted guest (as ``ip addr add`` through ``agent/exec`` does); it is
  reported by ``network-get-interfaces`` until the next boot. ``DELETE`` with the same body removes it.
  409 when the guest is not booted.
- ``POST /_sim/guests/{vmid}/listen`` ``{port, http_status?}`` / ``DELETE`` ``{port}``: a process in the guest
  listens on a TCP port (what a load balancer's health check finds, :mod:`z9.sim.appliance`).
- ``POST /_sim/appliance-faults`` ``{contains, inject?}`` / ``DELETE``: the next check or reload of an appliance
  file containing ``contains`` finds ``inject`` appended to it (a corrupted push; default: a line no tool
  knows), and the real ``haproxy -c`` / ``keepalived -t`` judges it.
- ``POST /_sim/guest-faults`` ``{kind: "agent_never_starts"|"cloud_init_fails", vmid?, name?, message?}`` →
  ``{"id": n}``: applies to VMs matching ``vmid`` and/or config ``name`` at their next start (and to a
  guest still booting / running cloud-init now). ``GET`` lists, ``DELETE /_sim/guest-faults[/{id}]``
  removes. Upload faults are ordinary ``/_sim/faults`` rules with ``action`` ``corrupt`` or ``abort``.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import logging
import math
import os
import re
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web
from pydantic import ValidationError

from .cluster import VM, Cluster, PveError
from .errors import param_error
from .faults import FaultSpec, FaultStore
from . import appliance
from .guest import OSINFO as GUEST_OSINFO
from . import kubeadm
from . import permissions
from .schema import JsonRef, PveSchema, stringify
from .storage import check_volname, volume_type

log = logging.getLogger("z9.sim")

Handler = Callable[["SimContext", dict[str, str], str, "str | None"], Awaitable[Any]]


#: how many requests the request log keeps (``GET /_sim/requests``)
REQUEST_LOG_MAX = 200_000


@dataclass
class SimContext:
    """Everything the handlers share (one per running simulator)."""

    cluster: Cluster
    seed: Callable[[], list[VM]]
    token_id: str
    token_secret: str
    password: str = "z9-dev-password"
    auth_delay_s: float = 0.0
    schema: PveSchema = field(default_factory=PveSchema.load)
    faults: FaultStore = field(default_factory=FaultStore)
    requests: collections.Counter = field(default_factory=collections.Counter)
    # the request log: (came in at, method, template or path, status, X-Z9-Lease or None)
    request_log: collections.deque = field(default_factory=lambda: collections.deque(maxlen=REQUEST_LOG_MAX))
    tickets: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    # local port -> node: the simulator listens once per node; a request is received by that node
    port_nodes: dict[int, str] = field(default_factory=dict)
    # API tokens added with POST /_sim/tokens (tokenid -> Token); the simulator's own is token_id
    tokens: dict[str, permissions.Token] = field(default_factory=dict)

    def token_of(self, user: str) -> "permissions.Token | None":
        """The API token a request authenticated with (None: a ticket); the simulator's own token is
        root@pam's and not privilege-separated."""
        if "!" not in user:
            return None
        return self.tokens.get(user) or permissions.Token(user, "", privsep=False)

    def counters(self) -> dict:
        return {
            "requests": [{"method": m, "path": p, "status": s, "count": n}
                         for (m, p, s), n in sorted(self.requests.items())],
            "tasks_started": dict(self.cluster.tasks_started),
        }


CTX = web.AppKey("sim_ctx", SimContext)


def pve_error(status: int, message: str, errors: dict | None = None) -> web.Response:
    reason = message.split("\n")[0].strip() or "error"
    body: dict[str, Any] = {"data": None, "message": message if message.endswith("\n") else message + "\n"}
    if errors:
        body["errors"] = errors
    return web.json_response(body, status=status, reason=reason)


# ---- PVE handlers ---------------------------------------------------------------------------------
def _vmid(p: dict[str, str]) -> int:
    return int(p["vmid"])


async def h_version(ctx, p, user, fail):
    return {"version": "9.1.3", "release": "9.1", "repoid": "z9sim000", "console": "xtermjs"}


async def h_nodes(ctx, p, user, fail):
    return [{"node": n, "status": "online", "type": "node", "id": f"node/{n}", "maxcpu": 16, "cpu": 0.02,
             "maxmem": 64 * 1024**3, "mem": 8 * 1024**3, "maxdisk": 500 * 1024**3, "disk": 10 * 1024**3,
             "uptime": 86400, "level": "", "ssl_fingerprint": "00:" * 31 + "00"} for n in ctx.cluster.nodes]


class RawJson(bytes):
    """A handler's answer that is already the encoded PVE envelope ``{"data": ...}``; ``gzip``: the
    bytes are gzip-compressed."""

    gzip = False


async def h_resources(ctx, p, user, fail):
    token = ctx.token_of(user)
    if user != "root@pam" and (token is None or token.user != "root@pam" or token.privsep):
        # pve-manager API2/Cluster.pm resources: a guest row only where the caller has VM.Audit on
        # /vms/<vmid> (`next if !$rpcenv->check($authuser, "/vms/$vmid", ['VM.Audit'], 1)`)
        rows = ctx.cluster.resources(p.get("type"))
        return [r for r in rows if "vmid" not in r
                or "VM.Audit" in permissions.privileges(token, user, f"/vms/{r['vmid']}")]
    gz = "gzip" in p.get("@accept_encoding", "")
    out = RawJson(ctx.cluster.resources_json(p.get("type"), gzip=gz))
    out.gzip = gz
    return out


async def h_nextid(ctx, p, user, fail):
    return ctx.cluster.nextid(p.get("vmid"))


async def h_qemu_list(ctx, p, user, fail):
    return ctx.cluster.list_qemu(p["node"])


async def h_qemu_create(ctx, p, user, fail):
    # qemu-server API2/Qemu.pm create_vm checks in code (schema: user => 'all'), before the task
    permissions.check_create(ctx.token_of(user), user, p, volume_type)
    return await ctx.cluster.create(p["node"], p, user, fail)


async def h_config_get(ctx, p, user, fail):
    return ctx.cluster.get_config(p["node"], _vmid(p), current=p.get("current") == "1")


async def h_pending(ctx, p, user, fail):
    return ctx.cluster.get_pending(p["node"], _vmid(p))


async def h_snapshot_list(ctx, p, user, fail):
    return ctx.cluster.snapshot_list(p["node"], _vmid(p))


async def h_snapshot_create(ctx, p, user, fail):
    return await ctx.cluster.snapshot(p["node"], _vmid(p), p, user, fail)


async def h_snapshot_index(ctx, p, user, fail):
    ctx.cluster.snapshot_config(p["node"], _vmid(p), p["snapname"])
    return [{"rel": "config"}, {"rel": "rollback"}]


async def h_snapshot_config(ctx, p, user, fail):
    return ctx.cluster.snapshot_config(p["node"], _vmid(p), p["snapname"])


async def h_snapshot_delete(ctx, p, user, fail):
    return await ctx.cluster.delete_snapshot(p["node"], _vmid(p), p["snapname"], p, user, fail)


async def h_snapshot_rollback(ctx, p, user, fail):
    return await ctx.cluster.rollback(p["node"], _vmid(p), p["snapname"], p, user, fail)


def _check_migrate(ctx, p, user) -> None:
    """qemu-server API2/Qemu.pm migrate_vm, before the task: ``targetstorage`` is a storage map
    (pve-common JSONSchema.pm ``parse_idmap``: ``1`` keeps each storage, ``<sid>`` maps all to one,
    ``<src>:<dst>,…`` per storage; a bad one 400 ``failed to parse storage map``); without the
    identity, VM.Config.Disk on the VM; each target storage ``$check_storage_access_migrate``:
    ``storage_check_enabled`` (an unknown storage dies ``storage '<sid>' does not exist``),
    Datastore.AllocateSpace on it, and it must hold images."""
    raw = p.get("targetstorage")
    if raw is None or raw == "":
        return
    token = ctx.token_of(user)
    entries = [e.strip() for e in re.split(r"[,;\s]+", str(raw)) if e.strip()]
    identity = False
    targets: list[str] = []
    for e in entries:
        if e == "1":
            identity = True
            continue
        src, sep, dst = e.partition(":")
        sid = dst if sep else src
        if not re.fullmatch(r"[a-z][a-z0-9\-_.]*[a-z0-9]", sid, re.IGNORECASE) or (sep and not re.fullmatch(
                r"[a-z][a-z0-9\-_.]*[a-z0-9]", src, re.IGNORECASE)):
            raise param_error({"targetstorage": f"failed to parse storage map: invalid format - "
                                                f"storage ID '{sid}' contains illegal characters\n"})
        targets.append(sid)
    if not identity and user != "root@pam":
        permissions.require(token, user, f"/vms/{_vmid(p)}", ["VM.Config.Disk"])
    for sid in targets:
        try:
            sdef = ctx.cluster.storage.definition(sid)
        except PveError:
            raise PveError(500, f"storage '{sid}' does not exist") from None
        if user != "root@pam":
            permissions.require(token, user, f"/storage/{sid}", ["Datastore.AllocateSpace"])
        if "images" not in sdef.content:
            raise PveError(500, f"storage '{sid}' does not support vm images")


async def h_migrate(ctx, p, user, fail):
    _check_migrate(ctx, p, user)
    return await ctx.cluster.migrate(p["node"], _vmid(p), p, user, fail)


def _check_config_write(ctx, p, user) -> None:
    """qemu-server API2/Qemu.pm ``$update_vm_api``, before anything is loaded or locked: each key
    set or deleted is checked (``$check_vm_modify_config_perm``), each drive by its kind (a CD-ROM
    VM.Config.CDROM, a disk VM.Config.Disk: ``$check_drive_param``, the delete loop — a deleted
    drive's kind from the current config), each NIC's bridge (``check_bridge_access``: SDN.Use)."""
    if user == "root@pam":
        return
    token, vmid = ctx.token_of(user), _vmid(p)
    deleted = [k for k in re.split(r"[,;\s]+", str(p.get("delete") or "")) if k]
    keys = [k for k in p if not k.startswith("@")] + deleted
    permissions.check_config_keys(token, user, vmid, keys)
    try:
        current = ctx.cluster.vm_on(p["node"], vmid).config
    except PveError:
        current = {}
    for k in keys:
        if permissions._DRIVE.fullmatch(k):
            permissions.check_drive(token, user, vmid, str(p.get(k) if k in p else current.get(k, "")))
        if re.fullmatch(r"net\d+", k) and k in p and (bridge := permissions.bridge_path(str(p[k]), ctx.cluster.sdn.vnet_zone)):
            permissions.require(token, user, bridge, ["SDN.Use"])


async def h_config_put(ctx, p, user, fail):
    _check_config_write(ctx, p, user)
    await ctx.cluster.put_config(p["node"], _vmid(p), p, user)
    return None


async def h_config_post(ctx, p, user, fail):
    _check_config_write(ctx, p, user)
    return await ctx.cluster.post_config(p["node"], _vmid(p), p, user, fail)


def _check_clone(ctx, p, user) -> None:
    """qemu-server API2/Qemu.pm clone_vm, after the schema's VM.Clone/VM.Allocate:
    ``$check_storage_access_clone`` — Datastore.AllocateSpace on the storage of every disk (the
    ``storage`` parameter's when given; CD-ROMs and the cloud-init drive are not checked) — and
    ``check_bridge_access`` on the source's NICs (SDN.Use on ``/sdn/zones/localnetwork/<bridge>``)."""
    if user == "root@pam":
        return
    token = ctx.token_of(user)
    try:
        conf = ctx.cluster.vm_on(p["node"], _vmid(p)).config
    except PveError:
        return  # the clone answers the missing VM itself
    for k, v in sorted(conf.items()):
        if permissions._DRIVE.fullmatch(k):
            volid = str(v).split(",", 1)[0]
            if "media=cdrom" in str(v) or volid in ("none", "cdrom", "") or ":" not in volid:
                continue
            sid = p.get("storage") or volid.split(":", 1)[0]
            permissions.require(token, user, f"/storage/{sid}", ["Datastore.AllocateSpace"])
    for k, v in sorted(conf.items()):
        if re.fullmatch(r"net\d+", k) and (bridge := permissions.bridge_path(str(v), ctx.cluster.sdn.vnet_zone)):
            permissions.require(token, user, bridge, ["SDN.Use"])


async def h_clone(ctx, p, user, fail):
    _check_clone(ctx, p, user)
    return await ctx.cluster.clone(p["node"], _vmid(p), p, user, fail)


async def h_destroy(ctx, p, user, fail):
    # qemu-server API2/Qemu.pm destroy_vm, first of all: raise_param_exc({ skiplock => "Only root
    # may use this option." }) if $skiplock && $authuser ne 'root@pam'
    if p.get("skiplock") not in (None, "", "0") and user != "root@pam":
        raise param_error({"skiplock": "Only root may use this option."})
    return await ctx.cluster.destroy(p["node"], _vmid(p), p, user, fail)


def _check_move_disk(ctx, p, user) -> None:
    """qemu-server API2/Qemu.pm move_vm_disk, after the schema's VM.Config.Disk on the source and
    before the task: to another VM (``target-vmid``) VM.Config.Disk on the target and
    Datastore.AllocateSpace on the disk's own storage; to a storage, Datastore.AllocateSpace there.
    (Both or neither is the cluster's 400, which PVE raises first for both.)"""
    if user == "root@pam" or bool(p.get("target-vmid")) == bool(p.get("storage")):
        return
    token = ctx.token_of(user)
    if p.get("target-vmid"):
        permissions.require(token, user, f"/vms/{p['target-vmid']}", ["VM.Config.Disk"])
        try:
            value = ctx.cluster.vm_on(p["node"], _vmid(p)).config.get(str(p.get("disk")), "")
        except PveError:
            return  # the move answers the missing VM itself
        sid = str(value).split(",", 1)[0].partition(":")[0]
        if sid:
            permissions.require(token, user, f"/storage/{sid}", ["Datastore.AllocateSpace"])
    else:
        permissions.require(token, user, f"/storage/{p['storage']}", ["Datastore.AllocateSpace"])


async def h_move_disk(ctx, p, user, fail):
    _check_move_disk(ctx, p, user)
    return await ctx.cluster.move_disk(p["node"], _vmid(p), p, user, fail)


async def h_resize(ctx, p, user, fail):
    token = ctx.token_of(user)

    def may_allocate(storage: str) -> None:
        # qemu-server API2/Qemu.pm resize_vm's $updatefn (in the resize task):
        # $rpcenv->check($authuser, "/storage/$storeid", ['Datastore.AllocateSpace'])
        if user != "root@pam":
            permissions.require(token, user, f"/storage/{storage}", ["Datastore.AllocateSpace"])
    return await ctx.cluster.resize(p["node"], _vmid(p), p, user, fail, may_allocate=may_allocate)


async def h_cloudinit(ctx, p, user, fail):
    await ctx.cluster.regenerate_cloudinit(p["node"], _vmid(p))
    return None


async def h_cloudinit_get(ctx, p, user, fail):
    return ctx.cluster.cloudinit_pending(p["node"], _vmid(p))


async def h_cloudinit_dump(ctx, p, user, fail):
    return ctx.cluster.cloudinit_dump(p["node"], _vmid(p), p["type"])


# firewall: keyed by vmid like /etc/pve/firewall/<vmid>.fw; only the node must exist (proxyto node)
def _fw(ctx, p) -> int:
    ctx.cluster.check_node(p["node"])
    return _vmid(p)


async def h_fw_index(ctx, p, user, fail):
    _fw(ctx, p)
    return [{"name": n} for n in ("rules", "aliases", "ipset", "refs", "options", "log")]


async def h_fw_options_get(ctx, p, user, fail):
    return ctx.cluster.firewall.get_vm_options(_fw(ctx, p))


async def h_fw_options_put(ctx, p, user, fail):
    ctx.cluster.firewall.set_vm_options(_fw(ctx, p), p)


async def h_fw_ipset_list(ctx, p, user, fail):
    return ctx.cluster.firewall.list_ipsets(_fw(ctx, p))


async def h_fw_ipset_create(ctx, p, user, fail):
    ctx.cluster.firewall.create_ipset(_fw(ctx, p), p)


async def h_fw_ipset_get(ctx, p, user, fail):
    return ctx.cluster.firewall.get_ipset(_fw(ctx, p), p["name"])


async def h_fw_ipset_add(ctx, p, user, fail):
    ctx.cluster.firewall.add_ip(_fw(ctx, p), p["name"], p)


async def h_fw_ipset_delete(ctx, p, user, fail):
    ctx.cluster.firewall.delete_ipset(_fw(ctx, p), p["name"], p.get("force") == "1")


async def h_fw_ip_get(ctx, p, user, fail):
    return ctx.cluster.firewall.read_ip(_fw(ctx, p), p["name"], p["cidr"])


async def h_fw_ip_put(ctx, p, user, fail):
    ctx.cluster.firewall.update_ip(_fw(ctx, p), p["name"], p["cidr"], p)


async def h_fw_ip_delete(ctx, p, user, fail):
    ctx.cluster.firewall.remove_ip(_fw(ctx, p), p["name"], p["cidr"], p)


async def h_fw_rules_list(ctx, p, user, fail):
    return ctx.cluster.firewall.list_rules(_fw(ctx, p))


async def h_fw_rule_create(ctx, p, user, fail):
    ctx.cluster.firewall.create_rule(_fw(ctx, p), p)


async def h_fw_rule_get(ctx, p, user, fail):
    return ctx.cluster.firewall.get_rule(_fw(ctx, p), int(p["pos"]))


async def h_fw_rule_put(ctx, p, user, fail):
    ctx.cluster.firewall.update_rule(_fw(ctx, p), int(p["pos"]), p)


async def h_fw_rule_delete(ctx, p, user, fail):
    ctx.cluster.firewall.delete_rule(_fw(ctx, p), int(p["pos"]), p)


async def h_cluster_fw_options_get(ctx, p, user, fail):
    return ctx.cluster.firewall.get_cluster_options()


async def h_cluster_fw_options_put(ctx, p, user, fail):
    ctx.cluster.firewall.set_cluster_options(p)


# ---- SDN (pve-network API2/Network/SDN.pm, SDN/Zones.pm, SDN/Vnets.pm, SDN/Nodes/Zones.pm) --------------
def _sdn_may(ctx, user: str, path: str, privs: tuple[str, ...]) -> bool:
    return user == "root@pam" or any(p in permissions.privileges(ctx.token_of(user), user, path) for p in privs)


def _sdn_require(ctx, user: str, path: str, priv: str) -> None:
    """A ``user => 'all'`` method's own check in code (Vnets.pm ``$check_vnet_access``)."""
    if not _sdn_may(ctx, user, path, (priv,)):
        raise PveError(403, f"Permission check failed ({path}, {priv})")


def _flag(p, key: str) -> bool:
    return str(p.get(key, "0")) in ("1", "true")


async def h_sdn_index(ctx, p, user, fail):
    return [{"id": i} for i in ("vnets", "zones", "controllers", "ipams", "dns", "fabrics")]


async def h_sdn_apply(ctx, p, user, fail):
    return ctx.cluster.sdn_apply(p, user)


async def h_sdn_lock(ctx, p, user, fail):
    return ctx.cluster.sdn.lock(_flag(p, "allow-pending"))


async def h_sdn_unlock(ctx, p, user, fail):
    ctx.cluster.sdn.unlock(p.get("lock-token"), _flag(p, "force"))


async def h_sdn_zones(ctx, p, user, fail):
    # Zones.pm index: only the zones the caller holds SDN.Audit or SDN.Allocate on
    rows = ctx.cluster.sdn.zones_list(_flag(p, "pending"), _flag(p, "running"))
    return [r for r in rows if _sdn_may(ctx, user, f"/sdn/zones/{r['zone']}", ("SDN.Audit", "SDN.Allocate"))]


async def h_sdn_zone_create(ctx, p, user, fail):
    ctx.cluster.sdn.zone_create(p)


async def h_sdn_zone_delete(ctx, p, user, fail):
    ctx.cluster.sdn.zone_delete(p["zone"], p.get("lock-token"))


async def h_sdn_vnets(ctx, p, user, fail):
    # Vnets.pm index: only the VNets the caller holds SDN.Audit or SDN.Allocate on (/sdn/zones/<zone>/<vnet>)
    rows = ctx.cluster.sdn.vnets_list(_flag(p, "pending"), _flag(p, "running"))
    out = []
    for r in rows:
        zone = r.get("zone") or (r.get("pending") or {}).get("zone")
        if _sdn_may(ctx, user, f"/sdn/zones/{zone}/{r['vnet']}", ("SDN.Audit", "SDN.Allocate")):
            out.append(r)
    return out


async def h_sdn_vnet_create(ctx, p, user, fail):
    ctx.cluster.sdn.vnet_create(p)


async def h_sdn_vnet_delete(ctx, p, user, fail):
    zone = ctx.cluster.sdn.vnet_zone(p["vnet"])
    _sdn_require(ctx, user, f"/sdn/zones/{zone}/{p['vnet']}", "SDN.Allocate")
    ctx.cluster.sdn.vnet_delete(p["vnet"], p.get("lock-token"))


async def h_node_sdn_zones(ctx, p, user, fail):
    # Nodes/Zones.pm index: "Only list entries where you have 'SDN.Audit'" (/sdn/zones/<zone>)
    ctx.cluster.check_node(p["node"])
    return [r for r in ctx.cluster.sdn.node_zones(p["node"])
            if _sdn_may(ctx, user, f"/sdn/zones/{r['zone']}", ("SDN.Audit",))]


# cluster IP sets (cluster.fw ``[IPSET <name>]``; pve-firewall API2/Firewall/IPSet.pm ClusterIPSetList,
# ClusterIPset): the handlers a VM's sets use, on the cluster's file
async def h_cluster_ipset_list(ctx, p, user, fail):
    return ctx.cluster.firewall.list_cluster_ipsets()


async def h_cluster_ipset_create(ctx, p, user, fail):
    ctx.cluster.firewall.create_cluster_ipset(p)


async def h_cluster_ipset_get(ctx, p, user, fail):
    return ctx.cluster.firewall.get_cluster_ipset(p["name"])


async def h_cluster_ipset_add(ctx, p, user, fail):
    ctx.cluster.firewall.add_cluster_ip(p["name"], p)


async def h_cluster_ipset_delete(ctx, p, user, fail):
    ctx.cluster.firewall.delete_cluster_ipset(p["name"], p.get("force") == "1")


async def h_cluster_ip_delete(ctx, p, user, fail):
    ctx.cluster.firewall.remove_cluster_ip(p["name"], p["cidr"], p)


# ---- storage --------------------------------------------------------------------------------------
async def h_storage_list(ctx, p, user, fail):
    # pve-storage API2/Storage/Status.pm index: only the storages the caller holds Datastore.Audit
    # or Datastore.AllocateSpace on (check_any, noerr)
    rows = ctx.cluster.storage.list_storages(p["node"], p)
    if user == "root@pam":
        return rows
    token = ctx.token_of(user)
    return [r for r in rows if permissions.privileges(token, user, f"/storage/{r['storage']}")
            & {"Datastore.Audit", "Datastore.AllocateSpace"}]


async def h_storage_index(ctx, p, user, fail):
    ctx.cluster.check_node(p["node"])
    ctx.cluster.storage.definition(p["storage"])
    return [{"subdir": s} for s in ("content", "download-url", "file-restore", "import-metadata", "prunebackups",
                                    "rrd", "rrddata", "status", "upload")]


async def h_storage_status(ctx, p, user, fail):
    rows = ctx.cluster.storage.list_storages(p["node"], {"storage": p["storage"]})
    if not rows:
        ctx.cluster.storage.definition(p["storage"])
    return rows[0]


async def h_storage_content(ctx, p, user, fail):
    return ctx.cluster.storage.content(p["node"], p["storage"], p)


async def h_storage_volume(ctx, p, user, fail):
    st = ctx.cluster.storage
    sid = p["storage"]
    volid = p["volume"] if ":" in p["volume"] else f"{sid}:{p['volume']}"
    ctx.cluster.check_node(p["node"])
    sdef = st.definition(volid.split(":", 1)[0])
    check_volname(sdef, volid.split(":", 1)[1])
    if sdef.path is None:  # a VM disk on the thin pool: its path under /dev/<vg>
        for d in st.content(p["node"], sdef.id, {}):
            if d["volid"] == volid:
                return {"path": f"/dev/pve/{volid.split(':', 1)[1]}", "size": d["size"], "used": d["size"],
                        "format": "raw"}
        raise PveError(500, f"volume '{volid}' does not exist")
    vol = st.volume(volid, p["node"])
    if vol is None:
        raise PveError(500, f"volume '{volid}' does not exist")
    sdef = st.definition(volid.split(":", 1)[0])
    return {"path": st._path(sdef, volid.split(":", 1)[1]), "size": vol.size, "used": vol.size, "format": vol.format}


async def h_storage_volume_delete(ctx, p, user, fail):
    if user != "root@pam":
        # pve-storage API2/Storage/Content.pm delete: Datastore.Allocate on the storage (the
        # AllocateSpace exception is for backup volumes of VMs one may back up: not modelled)
        permissions.require(ctx.token_of(user), user, f"/storage/{p['storage']}", ["Datastore.Allocate"])
    return await ctx.cluster.storage.delete(p["node"], p["storage"], p["volume"], p, user, fail)


async def h_upload(ctx, p, user, fail):
    if "tmpfilename" in p:
        raise PveError(400, "'tmpfilename' query parameter is not allowed for file uploads")
    data = p.get("@file")
    if data is not None and p.get("@corrupt"):
        mid = len(data) // 2
        data = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:] if data else b"\0"
    return ctx.cluster.storage.upload(p["node"], p.get("@received_on") or p["node"], p["storage"], p, data, user,
                                      fail)


# ---- guest agent ----------------------------------------------------------------------------------
def _agent_vm(ctx, p):
    return ctx.cluster.vm_on(p["node"], _vmid(p))


async def _agent_up(ctx, p) -> VM:
    """qemu-server Agent.pm ``assert_agent_available`` before every agent call: ``qga_check_running``
    is a ``guest-ping`` with ``timeout => 3``. Where the guest has the agent's virtio port but
    nothing answers on it (booting, the agent dead), that ping waits its whole timeout before PVE
    answers ``QEMU guest agent is not running`` — or goes through as soon as the agent comes up
    meanwhile. No port (agent off at start), no VM running, no ``agent`` key: at once."""
    vm = _agent_vm(ctx, p)
    guests = ctx.cluster.guests
    try:
        guests.agent(vm)
        return vm
    except PveError as e:
        g = guests.get(vm.vmid)
        if "guest agent is not running" not in str(e) or g is None or not g.agent_port:
            raise
    deadline = time.monotonic() + guests.settings.agent_timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        vm = _agent_vm(ctx, p)
        try:
            guests.agent(vm)
            return vm
        except PveError as e:
            if "guest agent is not running" not in str(e):
                raise
    guests.agent(_agent_vm(ctx, p))  # still not answering: PVE's error
    return vm


async def h_agent_index(ctx, p, user, fail):
    _agent_vm(ctx, p)
    return [{"name": n} for n in ("exec", "exec-status", "file-read", "file-write", "get-host-name", "get-osinfo",
                                  "info", "network-get-interfaces", "ping")]


def _agent_simple(name: str) -> Handler:
    async def h(ctx, p, user, fail):
        vm = await _agent_up(ctx, p)
        g = ctx.cluster.guests.agent(vm)
        cmd = p.get("command", name)
        if cmd == "ping":
            return {"result": {}}
        if cmd == "get-osinfo":
            return {"result": dict(GUEST_OSINFO)}
        if cmd == "network-get-interfaces":
            return {"result": g.interfaces()}
        if cmd == "get-host-name":
            return {"result": {"host-name": g.hostname or "localhost"}}
        if cmd == "info":
            return {"result": {"version": "7.2.0", "supported_commands": []}}
        raise PveError(501, f"agent command '{cmd}' not implemented (z9 simulator)")
    return h


async def h_agent_exec(ctx, p, user, fail):
    """qemu-server API2/Qemu/Agent.pm exec → Agent.pm ``qemu_exec``: ``path`` is the command's first
    element, ``arg`` the rest — no shell (qemu-ga's guest-exec spawns ``path`` itself)."""
    vm = await _agent_up(ctx, p)
    cmd = p.get("command")
    argv = list(cmd) if isinstance(cmd, list) else [cmd] if cmd else []
    stdin = p.get("input-data", "").encode()
    return {"pid": ctx.cluster.guests.exec(vm, [str(a) for a in argv], stdin)}


async def h_agent_exec_status(ctx, p, user, fail):
    return ctx.cluster.guests.exec_status(await _agent_up(ctx, p), int(p["pid"]))


async def h_agent_file_read(ctx, p, user, fail):
    vm = await _agent_up(ctx, p)
    data, truncated = ctx.cluster.guests.file_read(vm, p["file"], int(p.get("offset", 0)),
                                                   int(p.get("count", 16777216)))
    # PVE returns the bytes as a Perl byte string: JSON-encoded as if latin-1 (decode=0: base64)
    out = {"content": data.decode("latin-1") if p.get("decode", "1") == "1" else base64.b64encode(data).decode()}
    if truncated:
        out["truncated"] = 1
    return out


async def h_agent_file_write(ctx, p, user, fail):
    vm = await _agent_up(ctx, p)
    content = p["content"]
    if p.get("encode", "1") == "1":
        data = content.encode("utf-8")
    else:
        try:
            data = base64.b64decode(content, validate=True)
        except ValueError:
            raise PveError(500, f"VM {vm.vmid} qmp command 'guest-file-write' failed - "
                                "Invalid parameter type for 'buf-b64', expected: base64") from None
    ctx.cluster.guests.file_write(vm, p["file"], data)
    return None


async def h_status_current(ctx, p, user, fail):
    return ctx.cluster.status_current(p["node"], _vmid(p))


async def h_status_index(ctx, p, user, fail):
    ctx.cluster.vm_on(p["node"], _vmid(p))
    return [{"subdir": s} for s in ("current", "start", "stop", "reset", "shutdown", "suspend", "reboot")]


def _power(action: str) -> Handler:
    async def h(ctx, p, user, fail):
        return await ctx.cluster.power(p["node"], _vmid(p), action, p, user, fail)
    return h


def _check_task_user(ctx, p, user) -> None:
    """pve-manager API2/Tasks.pm read_task_status / read_task_log: Sys.Audit on /nodes/<node> unless
    the caller owns the task (``$check_task_user``: a token sees its own tasks, a user its own and
    its tokens')."""
    task = ctx.cluster.get_task(p["node"], p["upid"])
    owner = task.user
    if user == "root@pam" or user == owner or owner.split("!", 1)[0] == user:
        return
    permissions.require(ctx.token_of(user), user, f"/nodes/{p['node']}", ["Sys.Audit"])


async def h_task_status(ctx, p, user, fail):
    _check_task_user(ctx, p, user)
    return ctx.cluster.get_task(p["node"], p["upid"]).status_json()


async def h_task_log(ctx, p, user, fail):
    _check_task_user(ctx, p, user)
    return _with_total(*ctx.cluster.task_log(p["node"], p["upid"], int(p.get("start", 0)), int(p.get("limit", 50))))


class WithTotal(list):
    """A list answer with the envelope's ``total`` (``$rpcenv->set_result_attrib('total', …)``)."""

    total = 0


def _with_total(total: int, rows: list) -> WithTotal:
    out = WithTotal(rows)
    out.total = total
    return out


async def h_task_list(ctx, p, user, fail):
    return _with_total(*ctx.cluster.list_tasks(p["node"], p))


async def h_cluster_tasks(ctx, p, user, fail):
    # pve-manager API2/Cluster.pm tasks: the cluster's recent tasks (every node), no filters
    return ctx.cluster.list_tasks(None, {"source": "all", "limit": "1000"})[1]


async def h_cluster_status(ctx, p, user, fail):
    return ctx.cluster.cluster_status()


async def h_node_status(ctx, p, user, fail):
    return ctx.cluster.node_status(p["node"])


async def h_template(ctx, p, user, fail):
    return await ctx.cluster.make_template(p["node"], _vmid(p), p, user, fail)


def _suspend_resume(action: str) -> Handler:
    async def h(ctx, p, user, fail):
        return await ctx.cluster.suspend_resume(p["node"], _vmid(p), action, p, user, fail)
    return h


async def h_permissions(ctx, p, user, fail):
    """``GET /access/permissions`` (pve-access-control API2/AccessControl.pm permissions): the
    caller's privileges per ACL path — every privilege on ``/`` for root@pam and a token of it that
    is not privilege-separated, a privilege-separated token's own ACL paths otherwise; ``path``
    narrows the answer to that path. Another ``userid`` needs Sys.Audit on /access."""
    token = ctx.token_of(user)
    if p.get("userid") and p["userid"] != user and \
            "Sys.Audit" not in permissions.privileges(token, user, "/access"):
        raise PveError(403, "Permission check failed (/access, Sys.Audit)")
    if p.get("path"):
        return {p["path"]: {k: 1 for k in sorted(permissions.privileges(token, user, p["path"]))}}
    if token is not None and token.privsep:
        return {a.path: {k: 1 for k in sorted(permissions.privileges(token, user, a.path))} for a in token.acl}
    return {"/": {k: 1 for k in sorted(permissions.privileges(token, user, "/"))}}


async def h_task_index(ctx, p, user, fail):
    ctx.cluster.get_task(p["node"], p["upid"])
    return [{"name": "log"}, {"name": "status"}]


async def h_task_stop(ctx, p, user, fail):
    task = ctx.cluster.get_task(p["node"], p["upid"])
    for w in list(ctx.cluster._workers):
        if w.get_name() == task.upid:
            w.cancel()
    return None


async def h_ticket(ctx, p, user, fail):
    started = time.monotonic()  # the handler runs right after the body is read
    username = p["username"]
    if "@" not in username and p.get("realm"):
        username = f"{username}@{p['realm']}"
    if username != ctx.token_id.split("!")[0] or p["password"] != ctx.password:
        # pve-http-server AnyEvent.pm handle_api2_request: a handler's 401 (pve-access-control
        # API2/AccessControl.pm create_ticket dies "authentication failure" with code 401) is sent
        # "3 - tv_interval($reqstate->{starttime})" seconds after the request came in
        if ctx.auth_delay_s:
            await asyncio.sleep(max(0.0, ctx.auth_delay_s - (time.monotonic() - started)))
        raise PveError(401, "authentication failure")
    ticket = f"PVE:{username}:{int(time.time()):08X}::" + base64.b64encode(os.urandom(48)).decode()
    csrf = f"{int(time.time()):08X}:" + base64.b64encode(os.urandom(20)).decode().rstrip("=")
    ctx.tickets[ticket] = (username, csrf, time.time() + 7200)
    return {"username": username, "ticket": ticket, "CSRFPreventionToken": csrf, "cap": {}}


ROUTES: dict[tuple[str, str], Handler] = {
    ("GET", "/version"): h_version,
    ("GET", "/nodes"): h_nodes,
    ("GET", "/cluster/resources"): h_resources,
    ("GET", "/cluster/nextid"): h_nextid,
    ("GET", "/nodes/{node}/qemu"): h_qemu_list,
    ("POST", "/nodes/{node}/qemu"): h_qemu_create,
    ("GET", "/nodes/{node}/qemu/{vmid}/config"): h_config_get,
    ("PUT", "/nodes/{node}/qemu/{vmid}/config"): h_config_put,
    ("POST", "/nodes/{node}/qemu/{vmid}/config"): h_config_post,
    ("POST", "/nodes/{node}/qemu/{vmid}/clone"): h_clone,
    ("GET", "/nodes/{node}/qemu/{vmid}/pending"): h_pending,
    ("POST", "/nodes/{node}/qemu/{vmid}/template"): h_template,
    ("GET", "/nodes/{node}/qemu/{vmid}/snapshot"): h_snapshot_list,
    ("POST", "/nodes/{node}/qemu/{vmid}/snapshot"): h_snapshot_create,
    ("GET", "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}"): h_snapshot_index,
    ("GET", "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}/config"): h_snapshot_config,
    ("DELETE", "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}"): h_snapshot_delete,
    ("POST", "/nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback"): h_snapshot_rollback,
    ("POST", "/nodes/{node}/qemu/{vmid}/status/suspend"): _suspend_resume("suspend"),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/resume"): _suspend_resume("resume"),
    ("GET", "/cluster/tasks"): h_cluster_tasks,
    ("GET", "/cluster/status"): h_cluster_status,
    ("GET", "/nodes/{node}/status"): h_node_status,
    ("GET", "/access/permissions"): h_permissions,
    ("POST", "/nodes/{node}/qemu/{vmid}/migrate"): h_migrate,
    ("DELETE", "/nodes/{node}/qemu/{vmid}"): h_destroy,
    ("PUT", "/nodes/{node}/qemu/{vmid}/resize"): h_resize,
    ("POST", "/nodes/{node}/qemu/{vmid}/move_disk"): h_move_disk,
    ("PUT", "/nodes/{node}/qemu/{vmid}/cloudinit"): h_cloudinit,
    ("GET", "/nodes/{node}/qemu/{vmid}/cloudinit"): h_cloudinit_get,
    ("GET", "/nodes/{node}/qemu/{vmid}/cloudinit/dump"): h_cloudinit_dump,
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall"): h_fw_index,
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall/options"): h_fw_options_get,
    ("PUT", "/nodes/{node}/qemu/{vmid}/firewall/options"): h_fw_options_put,
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall/ipset"): h_fw_ipset_list,
    ("POST", "/nodes/{node}/qemu/{vmid}/firewall/ipset"): h_fw_ipset_create,
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}"): h_fw_ipset_get,
    ("POST", "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}"): h_fw_ipset_add,
    ("DELETE", "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}"): h_fw_ipset_delete,
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}"): h_fw_ip_get,
    ("PUT", "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}"): h_fw_ip_put,
    ("DELETE", "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}/{cidr}"): h_fw_ip_delete,
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall/rules"): h_fw_rules_list,
    ("POST", "/nodes/{node}/qemu/{vmid}/firewall/rules"): h_fw_rule_create,
    ("GET", "/nodes/{node}/qemu/{vmid}/firewall/rules/{pos}"): h_fw_rule_get,
    ("PUT", "/nodes/{node}/qemu/{vmid}/firewall/rules/{pos}"): h_fw_rule_put,
    ("DELETE", "/nodes/{node}/qemu/{vmid}/firewall/rules/{pos}"): h_fw_rule_delete,
    ("GET", "/cluster/sdn"): h_sdn_index,
    ("PUT", "/cluster/sdn"): h_sdn_apply,
    ("POST", "/cluster/sdn/lock"): h_sdn_lock,
    ("DELETE", "/cluster/sdn/lock"): h_sdn_unlock,
    ("GET", "/cluster/sdn/zones"): h_sdn_zones,
    ("POST", "/cluster/sdn/zones"): h_sdn_zone_create,
    ("DELETE", "/cluster/sdn/zones/{zone}"): h_sdn_zone_delete,
    ("GET", "/cluster/sdn/vnets"): h_sdn_vnets,
    ("POST", "/cluster/sdn/vnets"): h_sdn_vnet_create,
    ("DELETE", "/cluster/sdn/vnets/{vnet}"): h_sdn_vnet_delete,
    ("GET", "/nodes/{node}/sdn/zones"): h_node_sdn_zones,
    ("GET", "/cluster/firewall/options"): h_cluster_fw_options_get,
    ("GET", "/cluster/firewall/ipset"): h_cluster_ipset_list,
    ("POST", "/cluster/firewall/ipset"): h_cluster_ipset_create,
    ("GET", "/cluster/firewall/ipset/{name}"): h_cluster_ipset_get,
    ("POST", "/cluster/firewall/ipset/{name}"): h_cluster_ipset_add,
    ("DELETE", "/cluster/firewall/ipset/{name}"): h_cluster_ipset_delete,
    ("DELETE", "/cluster/firewall/ipset/{name}/{cidr}"): h_cluster_ip_delete,
    ("PUT", "/cluster/firewall/options"): h_cluster_fw_options_put,
    ("GET", "/nodes/{node}/qemu/{vmid}/status"): h_status_index,
    ("GET", "/nodes/{node}/qemu/{vmid}/status/current"): h_status_current,
    ("POST", "/nodes/{node}/qemu/{vmid}/status/start"): _power("start"),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/stop"): _power("stop"),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/shutdown"): _power("shutdown"),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/reboot"): _power("reboot"),
    ("POST", "/nodes/{node}/qemu/{vmid}/status/reset"): _power("reset"),
    ("GET", "/nodes/{node}/tasks"): h_task_list,
    ("GET", "/nodes/{node}/tasks/{upid}"): h_task_index,
    ("DELETE", "/nodes/{node}/tasks/{upid}"): h_task_stop,
    ("GET", "/nodes/{node}/tasks/{upid}/status"): h_task_status,
    ("GET", "/nodes/{node}/tasks/{upid}/log"): h_task_log,
    ("POST", "/access/ticket"): h_ticket,
    ("GET", "/nodes/{node}/storage"): h_storage_list,
    ("GET", "/nodes/{node}/storage/{storage}"): h_storage_index,
    ("GET", "/nodes/{node}/storage/{storage}/status"): h_storage_status,
    ("GET", "/nodes/{node}/storage/{storage}/content"): h_storage_content,
    ("GET", "/nodes/{node}/storage/{storage}/content/{volume}"): h_storage_volume,
    ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}"): h_storage_volume_delete,
    ("POST", "/nodes/{node}/storage/{storage}/upload"): h_upload,
    ("GET", "/nodes/{node}/qemu/{vmid}/agent"): h_agent_index,
    ("POST", "/nodes/{node}/qemu/{vmid}/agent"): _agent_simple(""),
    ("POST", "/nodes/{node}/qemu/{vmid}/agent/ping"): _agent_simple("ping"),
    ("GET", "/nodes/{node}/qemu/{vmid}/agent/get-osinfo"): _agent_simple("get-osinfo"),
    ("GET", "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces"): _agent_simple("network-get-interfaces"),
    ("GET", "/nodes/{node}/qemu/{vmid}/agent/get-host-name"): _agent_simple("get-host-name"),
    ("GET", "/nodes/{node}/qemu/{vmid}/agent/info"): _agent_simple("info"),
    ("POST", "/nodes/{node}/qemu/{vmid}/agent/exec"): h_agent_exec,
    ("GET", "/nodes/{node}/qemu/{vmid}/agent/exec-status"): h_agent_exec_status,
    ("GET", "/nodes/{node}/qemu/{vmid}/agent/file-read"): h_agent_file_read,
    ("POST", "/nodes/{node}/qemu/{vmid}/agent/file-write"): h_agent_file_write,
}
UPLOAD_TEMPLATE = "/nodes/{node}/storage/{storage}/upload"
GZIP_MIN = 1024  # pve-http-server compresses answers over 1 KiB for clients that accept gzip
MAX_BODY = 512 * 1024  # pve-http-server: non-upload POST/PUT bodies (64 KiB before "fix #6230")
NO_AUTH = {("POST", "/access/ticket")}


async def _read_params(request: web.Request, arrays: set[str]) -> tuple[dict[str, Any], bytes | None]:
    """Query + body parameters, and the uploaded file's bytes. ``arrays``: the endpoint's array-typed
    parameters, which collect repeated form fields (``command=a&command=b``) into a list; other repeated
    fields: the last wins. A multipart file part named ``filename`` gives ``filename`` (its file name) and
    the bytes (returned apart, so no client parameter can stand in for them)."""
    params: dict[str, Any] = {}
    file: bytes | None = None

    def put(k: str, v: Any) -> None:
        if k in arrays:
            params.setdefault(k, []).append(v)
        else:
            params[k] = v

    for k, v in request.query.items():
        put(k, v)
    if request.method in ("POST", "PUT") and request.can_read_body:
        ctype = request.content_type
        if ctype == "application/json":
            body = await request.json()
            if isinstance(body, dict):
                for k, v in body.items():
                    if v is None:
                        continue
                    if k in arrays and isinstance(v, list):
                        params[k] = [JsonRef.of(x) if isinstance(x, (dict, list)) else stringify(x) for x in v]
                    elif isinstance(v, (dict, list)):
                        params[k] = JsonRef.of(v)  # a reference where a scalar (or an array) is wanted
                    else:
                        put(k, stringify(v))
        else:
            form = await request.post()
            for k, v in form.items():
                if isinstance(v, str):
                    put(k, v)
                elif isinstance(v, web.FileField) and k == "filename":
                    params["filename"] = v.filename or ""
                    file = v.file.read()
    return params, file


async def _authenticate(ctx: SimContext, request: web.Request, csrf: bool = True) -> str | PveError:
    """Return the user (``root@pam!z9`` for the token) or the PveError to answer."""
    auth = request.headers.get("Authorization", "")
    if auth.startswith("PVEAPIToken"):
        value = auth[len("PVEAPIToken"):].lstrip("= ")
        tokenid, sep, secret = value.rpartition("=")
        if sep and tokenid == ctx.token_id and secrets.compare_digest(secret, ctx.token_secret):
            return tokenid
        extra = ctx.tokens.get(tokenid) if sep else None
        if extra is not None and secrets.compare_digest(secret, extra.secret):
            return tokenid
    elif cookie := request.cookies.get("PVEAuthCookie"):
        entry = ctx.tickets.get(cookie)
        if entry and entry[2] > time.time():
            if csrf and request.method != "GET" and request.headers.get("CSRFPreventionToken") != entry[1]:
                return await _auth_failed(ctx, "Permission denied - invalid csrf token")
            return entry[0]
    else:
        return await _auth_failed(ctx, "No ticket")
    return await _auth_failed(ctx, "Authentication failed!")


async def _auth_failed(ctx: SimContext, reason: str) -> PveError:
    """pve-http-server ``src/PVE/APIServer/AnyEvent.pm`` handle_request: whatever ``auth_handler`` dies
    of (no ticket, a bad ticket or API token, a bad CSRF token) is answered after ``my $delay = 3``
    ("always delay unauthorized calls by 3 seconds"), a bare 401 with the reason phrase."""
    if ctx.auth_delay_s:
        await asyncio.sleep(ctx.auth_delay_s)
    return PveError(401, reason)


async def api_handler(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    method = request.method
    path = "/" + request.match_info["tail"].lstrip("/")
    template: str | None = None
    status = 500
    came_in = time.time()
    try:
        resp, template, drop = await _handle(ctx, request, method, path)
        status = resp.status
        if drop:
            status = 0  # counted as "no response"
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError  # aiohttp: handler gone, nothing is written
        return resp
    finally:
        ctx.requests[(method, template or path, status)] += 1
        ctx.request_log.append((came_in, method, template or path, status, request.headers.get("X-Z9-Lease")))


async def _handle(ctx: SimContext, request: web.Request, method: str, path: str):
    ep, _ = ctx.schema.match(method, path)
    template = ep.template if ep else None
    if (method, template) not in NO_AUTH:
        # pve-manager HTTPServer.pm: the upload path skips the CSRF check (it checks the privilege instead)
        user = await _authenticate(ctx, request, csrf=template != UPLOAD_TEMPLATE)
        if isinstance(user, PveError):
            if user.status == 401:  # pve-http-server AnyEvent.pm: a 401 carries its reason, no body
                return web.Response(status=401, reason=user.message), template, False
            return pve_error(user.status, user.message), template, False
    else:
        user = ""
    upload = template == UPLOAD_TEMPLATE and method == "POST"
    if method in ("POST", "PUT") and not upload and (request.content_length or 0) > MAX_BODY:
        return pve_error(501, "for data too large"), template, False
    if upload:  # pve-http-server AnyEvent.pm: the upload path streams a multipart body of known length
        ctype = request.headers.get("Content-Type", "")
        if not re.match(r"multipart/form-data;\s*boundary=.+", ctype):
            return pve_error(501, f"upload 'Content-Type '{ctype}' not implemented"), template, False
        if not request.content_length:
            return pve_error(501, "upload without content length header not supported"), template, False
    if upload and ctx.faults.match(method, path, actions={"abort"}) is not None:
        # the upload breaks off: part of the body arrives, then the connection is gone (no task, no file)
        with contextlib.suppress(Exception):
            await request.content.read(1024)
        return pve_error(500, "upload aborted"), template, True
    arrays = {k for k, sch in ep.properties.items() if sch.get("type") == "array"} if ep else set()
    try:
        params, file = await _read_params(request, arrays)
    except (ValueError, json.JSONDecodeError):
        return pve_error(400, "Parameter verification failed."), template, False
    template, errors = ctx.schema.validate(method, path, params)
    if template is None:
        return pve_error(501, f"Method '{method} {path}' not implemented"), None, False
    if errors:
        return pve_error(400, "Parameter verification failed.", errors), template, False
    _, path_params = ctx.schema.match(method, path)
    values: dict[str, Any] = {k: (v if isinstance(v, list) else stringify(v)) for k, v in params.items()}
    values.update(path_params)
    if ep is not None and (method, template) not in NO_AUTH:
        # pve-access-control RPCEnvironment.pm check_api2_permissions, after parameter verification
        try:
            permissions.check(ep.permissions, ctx.token_of(user), user, values)
        except PveError as e:
            return pve_error(e.status, e.message), template, False
    # request-internal values ("@..."): set here only; a client's "@x" parameter failed the schema above
    if upload and file is not None:  # the file part reaches the upload handler only
        values["@file"] = file
    if template == "/cluster/resources":
        values["@accept_encoding"] = request.headers.get("Accept-Encoding", "")
    if upload:
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        values["@received_on"] = ctx.port_nodes.get(sock[1]) if sock else None

    fault = ctx.faults.match(method, path)
    fail: str | None = None
    drop = False
    if fault is not None:
        if fault.action == "corrupt":
            if upload:
                values["@corrupt"] = "1"
        elif fault.action == "error":
            return pve_error(fault.status, fault.reason), template, False
        if fault.action == "delay":
            await asyncio.sleep(fault.seconds)
        elif fault.action == "drop":
            drop = True
        elif fault.action == "fail_task":
            vmid = values.get("vmid", "0")
            fail = fault.exitstatus or f"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"

    handler = ROUTES.get((method, template))
    if handler is None:
        # pve-http-server: PVE's own answer for a path it has no handler for
        return pve_error(501, f"Method '{method} {path}' not implemented"), template, drop
    try:
        data = await handler(ctx, values, user, fail)
    except PveError as e:
        return pve_error(e.status, e.message, e.errors), template, drop
    if isinstance(data, RawJson):
        resp = web.Response(body=data, content_type="application/json")
        if data.gzip:
            resp.headers["Content-Encoding"] = "gzip"
        return resp, template, drop
    envelope: dict[str, Any] = {"data": data}
    if isinstance(data, WithTotal):
        envelope["total"] = data.total
    resp = web.json_response(envelope)
    if resp.body is not None and len(resp.body) > GZIP_MIN and "gzip" in request.headers.get("Accept-Encoding", ""):
        resp.enable_compression(web.ContentCoding.gzip)  # pve-http-server gzips larger answers
    return resp, template, drop


# ---- admin API ------------------------------------------------------------------------------------
@web.middleware
async def loopback_only(request: web.Request, handler):
    if request.path.startswith("/_sim") and request.remote not in ("127.0.0.1", "::1", "localhost"):
        return web.json_response({"error": "admin API is loopback-only"}, status=403)
    return await handler(request)


async def _json(request: web.Request) -> dict:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except json.JSONDecodeError as e:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"invalid JSON: {e}"}), content_type="application/json")
    return body if isinstance(body, dict) else {}


async def admin_fault_add(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    try:
        spec = FaultSpec.model_validate(await _json(request))
    except (ValidationError, ValueError) as e:
        return web.json_response({"error": str(e)}, status=400)
    return web.json_response({"id": ctx.faults.add(spec).id})


async def admin_fault_list(request: web.Request) -> web.Response:
    return web.json_response(request.app[CTX].faults.list())


async def admin_fault_clear(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    n = len(ctx.faults.list())
    ctx.faults.clear()
    return web.json_response({"deleted": n})


async def admin_fault_delete(request: web.Request) -> web.Response:
    ok = request.app[CTX].faults.delete(int(request.match_info["id"]))
    return web.json_response({"deleted": int(ok)}, status=200 if ok else 404)


async def admin_token_add(request: web.Request) -> web.Response:
    """``POST /_sim/tokens`` ``{tokenid: "root@pam!ci", privsep: true, acl: [{path, privs: [...],
    propagate?: true}]}`` → ``{tokenid, value}``: an API token as ``pveum user token add`` makes one
    (and ``pveum acl modify … --tokens``)."""
    ctx = request.app[CTX]
    b = await _json(request)
    tokenid = str(b.get("tokenid", ""))
    if not re.fullmatch(r"[^\s:/!]+@[A-Za-z][\w.-]+![A-Za-z][\w.-]+", tokenid):
        return web.json_response({"error": "tokenid must be user@realm!name"}, status=400)
    try:
        acl, user_acl = ([permissions.Acl(str(a["path"]), frozenset(map(str, a.get("privs") or [])),
                                          bool(a.get("propagate", True))) for a in b.get(key) or []]
                         for key in ("acl", "user_acl"))
    except (KeyError, TypeError, AttributeError) as e:
        return web.json_response({"error": f"bad acl or user_acl: {e}"}, status=400)
    tok = permissions.Token(tokenid, str(uuid.uuid4()), bool(b.get("privsep", True)), acl, user_acl)
    ctx.tokens[tokenid] = tok
    return web.json_response({"tokenid": tokenid, "value": tok.secret})


async def admin_sdn_reload_fault(request: web.Request) -> web.Response:
    """``POST /_sim/sdn/reload-fault`` ``{node, fail: bool}``: that node's network reload fails
    (``ifreload -a`` exits 1) until cleared: its zones stay ``pending``, its VNets do not come up."""
    ctx = request.app[CTX]
    body = await request.json()
    node = str(body.get("node") or "")
    if node not in ctx.cluster.nodes:
        return web.json_response({"error": f"no node {node!r}"}, status=400)
    ctx.cluster.sdn.fail_reload(node, bool(body.get("fail", True)))
    return web.json_response({"failing": sorted(ctx.cluster.sdn.failing)})


async def admin_sdn_state(request: web.Request) -> web.Response:
    """``GET /_sim/sdn``: pending and running config, the lock, each node's applied copy, applies."""
    return web.json_response(request.app[CTX].cluster.sdn.dump())


async def admin_reset(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    ctx.faults.clear()
    ctx.requests.clear()
    ctx.request_log.clear()
    ctx.tickets.clear()
    ctx.tokens.clear()
    await ctx.cluster.reset(ctx.seed())
    return web.json_response({"ok": True})


async def admin_state(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    c = ctx.cluster
    return web.json_response({
        "vms": [vm.to_json() for vm in sorted(c.vms.values(), key=lambda v: v.vmid)],
        "tasks": [t.to_json() for t in c.tasks.values()],
        "counters": ctx.counters(),
        "stats_refreshed_at": c.stats_refreshed_at,
        "firewall": c.firewall.dump(),
        "node_ports": {n: p for p, n in sorted(ctx.port_nodes.items())},
        "guests": {str(v): g.summary() for v, g in sorted(c.guests.guests.items())
                   if c.guests.get(v) is not None},
        "storage": c.storage.dump(),
    })


async def admin_counters(request: web.Request) -> web.Response:
    """``GET /_sim/counters``: the request and task counters of ``/_sim/state`` alone (that one
    also summarises every guest, which evaluates each one's boot — at 10,000 seeded guests, minutes)."""
    return web.json_response(request.app[CTX].counters())


async def admin_requests(request: web.Request) -> web.Response:
    """``GET /_sim/requests[?lease=<text>]``: the request log (module docstring)."""
    want = request.query.get("lease")
    rows = [{"at": at, "method": m, "path": p, "status": st, "lease": lease}
            for at, m, p, st, lease in list(request.app[CTX].request_log)
            if want is None or (lease is not None and want in lease)]
    return web.json_response(rows)


async def admin_stats_refresh(request: web.Request) -> web.Response:
    request.app[CTX].cluster.refresh_stats()
    return web.json_response({"ok": True})


async def admin_vm_put(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    b = await _json(request)
    try:
        vm = VM(int(b["vmid"]), str(b.get("node", ctx.cluster.nodes[0])),
                {k: stringify(v) for k, v in (b.get("config") or {}).items()}, bool(b.get("running", False)),
                time.time() if b.get("running") else None)
    except (KeyError, ValueError, TypeError) as e:
        return web.json_response({"error": f"bad VM: {e}"}, status=400)
    if vm.node not in ctx.cluster.nodes:
        return web.json_response({"error": f"unknown node {vm.node}"}, status=400)
    _keep_dropped_images(ctx.cluster, vm)
    guest = b.get("guest")
    if guest is not None:
        if not isinstance(guest, dict):
            return web.json_response({"error": "bad VM: guest must be an object"}, status=400)
        try:  # the disk state a clone inherits (z9.sim.guest Guests.clone_disk)
            g = ctx.cluster.guests.load_one(vm.vmid, {"files": guest.get("files") or {},
                                                      "models": guest.get("models") or {}})
        except (ValueError, TypeError) as e:
            return web.json_response({"error": f"bad VM: guest: {e}"}, status=400)
    ctx.cluster.add_vm(vm)
    if guest is not None:
        have = ctx.cluster.guests.guests.get(vm.vmid)  # a running VM's guest exists already
        if have is None:
            ctx.cluster.guests.guests[vm.vmid] = g
        else:
            have._files.update(g._files)
            have.models.update(g.models)
    return web.json_response(vm.to_json())


def _keep_dropped_images(c: Cluster, new: VM) -> None:
    """A VM put in place over an existing one is its config file edited by hand: a disk the new config
    no longer names stays on its storage, an image owned by the vmid that no config references (pve-storage
    keeps images apart from configs: ``vdisk_list`` lists it by its ``vm-<vmid>-…`` name, and qemu-server
    destroy_vm's ``$purge_unreferenced`` frees it with ``destroy-unreferenced-disks``)."""
    from .disks import DISK_RE

    old = c.vms.get(new.vmid)
    if old is None:
        return
    named = {str(v).split(",", 1)[0] for v in new.config.values()}
    for k, val in sorted(old.config.items()):
        volid = str(val).split(",", 1)[0]
        if not DISK_RE.fullmatch(k) or ":" not in volid or "cloudinit" in volid or "media=cdrom" in str(val):
            continue
        if volid not in named:
            c.storage.orphan_add(volid, old.node, c.volume_size(old, k), old.vmid)


async def admin_vm_delete(request: web.Request) -> web.Response:
    c = request.app[CTX].cluster
    vmid = int(request.match_info["vmid"])
    ok = c.vms.pop(vmid, None) is not None
    if ok:
        c.firewall.remove(vmid)
        c.guests.remove(vmid)
    return web.json_response({"deleted": int(ok)}, status=200 if ok else 404)


async def admin_tasks_hold(request: web.Request) -> web.Response:
    """Workers of ``type`` run past their duration until released (a reset releases all)."""
    ttype = (await _json(request)).get("type")
    if not isinstance(ttype, str) or not ttype:
        return web.json_response({"error": "bad hold request: type (a task type) is required"}, status=400)
    request.app[CTX].cluster.hold_tasks(ttype)
    return web.json_response({"ok": True})


async def admin_tasks_release(request: web.Request) -> web.Response:
    ttype = (await _json(request)).get("type")
    if ttype is not None and not isinstance(ttype, str):
        return web.json_response({"error": "bad release request: type must be a task type"}, status=400)
    request.app[CTX].cluster.release_tasks(ttype)
    return web.json_response({"ok": True})


async def admin_flock(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    b = await _json(request)
    try:
        vmid, seconds = int(b["vmid"]), float(b.get("seconds", 1.0))
    except (KeyError, ValueError, TypeError) as e:
        return web.json_response({"error": f"bad flock request (vmid, seconds): {e!r}"}, status=400)
    await ctx.cluster.flock(vmid).acquire(vmid, timeout=30)

    async def release_later():
        await asyncio.sleep(seconds)
        await ctx.cluster.flock(vmid).release()

    t = asyncio.create_task(release_later())
    ctx.cluster._workers.add(t)
    t.add_done_callback(ctx.cluster._workers.discard)
    return web.json_response({"ok": True})


async def admin_guest(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    g = ctx.cluster.guests.get(int(request.match_info["vmid"]))
    if g is None:
        return web.json_response({"error": "no guest: the VM was never started (or is destroyed)"}, status=404)
    return web.json_response(g.to_json())


async def admin_guest_address(request: web.Request) -> web.Response:
    """Configure (POST) or remove (DELETE) an address inside a running guest, as ``ip addr add`` would."""
    ctx = request.app[CTX]
    vmid = int(request.match_info["vmid"])
    g = ctx.cluster.guests.get(vmid)
    if g is None or not g.booted:
        return web.json_response({"error": f"VM {vmid} has no booted guest"}, status=409)
    b = await _json(request)
    try:
        iface, address = str(b.get("iface", "eth0")), str(b["address"])
        if request.method == "POST":
            g.add_address(iface, address)
        elif not g.remove_address(iface, address):
            return web.json_response({"error": f"{address} is not on {iface}"}, status=404)
    except (KeyError, ValueError) as e:
        return web.json_response({"error": f"bad address: {e}"}, status=400)
    return web.json_response({"interfaces": g.interfaces()})


async def admin_guest_listen(request: web.Request) -> web.Response:
    """A process in the guest listens (POST ``{port, http_status?}``) or stops listening (DELETE
    ``{port}``) on a TCP port: what a load balancer's health check finds (:mod:`z9.sim.appliance`).
    Kept across reboots (a service enabled in the guest)."""
    ctx = request.app[CTX]
    vmid = int(request.match_info["vmid"])
    g = ctx.cluster.guests.guests.get(vmid)
    if g is None:
        return web.json_response({"error": f"VM {vmid} has no guest (never started)"}, status=409)
    b = await _json(request)
    try:
        port = int(b["port"])
        if not 0 < port < 65536:
            raise ValueError(port)
    except (KeyError, ValueError, TypeError):
        return web.json_response({"error": "port: 1-65535 required"}, status=400)
    lst = appliance.listening(g)
    if request.method == "POST":
        lst[str(port)] = {"http_status": int(b.get("http_status", 200))}
    else:
        lst.pop(str(port), None)
    return web.json_response({"listen": lst})


async def admin_appliance_fault(request: web.Request) -> web.Response:
    """POST ``{contains, inject?}``: the next check of an appliance file containing ``contains``
    finds ``inject`` appended to it (the real tool judges it); DELETE: no such fault any more."""
    ctx = request.app[CTX]
    faults = appliance.faults(ctx.cluster.guests)
    if request.method == "DELETE":
        faults.clear()
        return web.json_response({"faults": []})
    b = await _json(request)
    if not isinstance(b.get("contains"), str) or not b["contains"]:
        return web.json_response({"error": "contains: a non-empty string"}, status=400)
    if b.get("inject") is not None and not isinstance(b["inject"], str):
        return web.json_response({"error": "inject: a string"}, status=400)
    faults.append({"contains": b["contains"], "inject": b.get("inject") or appliance.DEFAULT_INJECT})
    return web.json_response({"faults": faults})


async def admin_guest_fault_add(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    b = await _json(request)
    try:
        f = ctx.cluster.guests.add_fault(str(b.get("kind")), int(b["vmid"]) if b.get("vmid") is not None else None,
                                         b.get("name"), b.get("message"))
    except (ValueError, TypeError) as e:
        return web.json_response({"error": str(e)}, status=400)
    return web.json_response({"id": f.id})


async def admin_guest_fault_list(request: web.Request) -> web.Response:
    return web.json_response([f.to_json() for f in request.app[CTX].cluster.guests.faults])


async def admin_guest_fault_clear(request: web.Request) -> web.Response:
    g = request.app[CTX].cluster.guests
    n = len(g.faults)
    g.faults.clear()
    return web.json_response({"deleted": n})


async def admin_guest_fault_delete(request: web.Request) -> web.Response:
    ok = request.app[CTX].cluster.guests.delete_fault(int(request.match_info["id"]))
    return web.json_response({"deleted": int(ok)}, status=200 if ok else 404)


async def admin_k8s_expire_tokens(request: web.Request) -> web.Response:
    """Fault: every bootstrap token of every simulated Kubernetes cluster expires now."""
    return web.json_response({"expired": kubeadm.expire_tokens(request.app[CTX].cluster.guests)})


async def admin_k8s_clusters(request: web.Request) -> web.Response:
    """The kubeadm model's clusters by endpoint (CA hash, tokens, nodes, events)."""
    return web.json_response(kubeadm.clusters(request.app[CTX].cluster.guests))


async def admin_firewall_deliver(request: web.Request) -> web.Response:
    """``GET /_sim/firewall/deliver?src=&dst=&proto=&port=&sport=``: would the first packet of a new
    connection from ``src`` (an address — a guest's or any other — or a vmid) to ``dst`` (a vmid or
    an address a guest holds) be delivered, by what pve-firewall last compiled (z9.sim.firewall
    ``deliver``)? → ``{delivered, reason, src_vmid, dst_vmid, steps}``; 400 for a malformed question."""
    from .firewall import deliver

    q = request.query
    try:
        if not q.get("src") or not q.get("dst"):
            raise ValueError("src and dst are required")
        port = int(q["port"]) if q.get("port") else None
        sport = int(q["sport"]) if q.get("sport") else None
        d = deliver(request.app[CTX].cluster, q["src"], q["dst"], q.get("proto", "tcp"), port, sport)
    except ValueError as e:
        return web.json_response({"error": f"bad question: {e}"}, status=400)
    return web.json_response(d.to_json())


def _clock_json(fw) -> dict:
    c = fw.compiled()
    return {"now": fw.clock.now(), "manual": fw.clock.manual, "cycle": c.cycle, "compiled_at": c.at,
            "next_cycle_in": fw.next_cycle_in()}


async def admin_firewall_clock(request: web.Request) -> web.Response:
    """``GET``/``POST /_sim/firewall/clock`` ``{advance?: seconds, next_cycle?: true}``: the clock of
    pve-firewall's 10 s compile cycle; ``advance`` moves it, ``next_cycle`` moves it to the next
    compile (a write made before is enforced after it) → ``{now, manual, cycle, compiled_at,
    next_cycle_in}``."""
    fw = request.app[CTX].cluster.firewall
    if request.method == "POST":
        b = await _json(request)
        try:
            seconds = float(b.get("advance", 0))
            if seconds < 0 or not math.isfinite(seconds):
                raise ValueError("advance: seconds >= 0")
        except (TypeError, ValueError) as e:
            return web.json_response({"error": f"bad clock step: {e}"}, status=400)
        fw.tick()  # what was written so far belongs to the cycle it was written in
        if b.get("next_cycle"):
            seconds += fw.next_cycle_in() + 1e-6  # past the boundary, whatever the float rounding
        fw.clock.advance(seconds)
        fw.tick()
    return web.json_response(_clock_json(fw))


async def admin_config(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    c = ctx.cluster
    b = await _json(request)
    scalars = ("guest_boot_s", "cloud_init_s", "task_default_s", "stats_lag_s", "task_invisible_s", "auth_delay_s",
               "k8s_api_delay_s", "agent_timeout_s")
    try:  # all values checked before any is applied
        unknown = sorted(set(b) - set(scalars) - {"task_seconds", "clone_race", "firewall_clock"})
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}")
        if b.get("firewall_clock", "manual") not in ("manual", "real"):
            raise ValueError("firewall_clock: manual or real")
        vals = {k: float(b[k]) for k in scalars if k in b}
        if any(v < 0 for v in vals.values()):
            raise ValueError("durations must not be negative")
        task_seconds = {str(k): float(v) for k, v in (b.get("task_seconds") or {}).items()}
    except (ValueError, TypeError, AttributeError) as e:
        return web.json_response({"error": f"bad config: {e}"}, status=400)
    if "guest_boot_s" in vals:
        c.guests.settings.boot_s = vals["guest_boot_s"]
    if "cloud_init_s" in vals:
        c.guests.settings.cloud_init_s = vals["cloud_init_s"]
    if "agent_timeout_s" in vals:
        c.guests.settings.agent_timeout_s = vals["agent_timeout_s"]
    c.task_seconds.update(task_seconds)
    if "clone_race" in b:  # the next n clones lose PVE's racy newid check (Cluster.clone)
        c.clone_race = int(b["clone_race"])
    for k in ("task_default_s", "stats_lag_s", "task_invisible_s"):
        if k in vals:
            setattr(c, k, vals[k])
    if "auth_delay_s" in vals:
        ctx.auth_delay_s = vals["auth_delay_s"]
    if "k8s_api_delay_s" in vals:
        kubeadm.SETTINGS["api_delay_s"] = vals["k8s_api_delay_s"]
    if "firewall_clock" in b:
        c.firewall.clock.set_manual(b["firewall_clock"] == "manual")
    return web.json_response({"k8s_api_delay_s": kubeadm.SETTINGS["api_delay_s"],
                              "task_seconds": c.task_seconds, "task_default_s": c.task_default_s,
                              "stats_lag_s": c.stats_lag_s, "task_invisible_s": c.task_invisible_s,
                              "auth_delay_s": ctx.auth_delay_s, "guest_boot_s": c.guests.settings.boot_s,
                              "cloud_init_s": c.guests.settings.cloud_init_s, "clone_race": c.clone_race,
                              "agent_timeout_s": c.guests.settings.agent_timeout_s,
                              "firewall_clock": "manual" if c.firewall.clock.manual else "real"})


def create_app(ctx: SimContext) -> web.Application:
    """The simulator's aiohttp application (PVE API + admin API) around one :class:`SimContext`."""
    app = web.Application(middlewares=[loopback_only], client_max_size=1024**3)  # uploads: ISOs
    app[CTX] = ctx
    app.router.add_post("/_sim/faults", admin_fault_add)
    app.router.add_get("/_sim/faults", admin_fault_list)
    app.router.add_delete("/_sim/faults", admin_fault_clear)
    app.router.add_delete("/_sim/faults/{id:\\d+}", admin_fault_delete)
    app.router.add_post("/_sim/reset", admin_reset)
    app.router.add_post("/_sim/tokens", admin_token_add)
    app.router.add_get("/_sim/state", admin_state)
    app.router.add_get("/_sim/counters", admin_counters)
    app.router.add_get("/_sim/requests", admin_requests)
    app.router.add_post("/_sim/stats/refresh", admin_stats_refresh)
    app.router.add_post("/_sim/vms", admin_vm_put)
    app.router.add_delete("/_sim/vms/{vmid:\\d+}", admin_vm_delete)
    app.router.add_post("/_sim/flock", admin_flock)
    app.router.add_post("/_sim/tasks/hold", admin_tasks_hold)
    app.router.add_post("/_sim/tasks/release", admin_tasks_release)
    app.router.add_put("/_sim/config", admin_config)
    app.router.add_get("/_sim/firewall/deliver", admin_firewall_deliver)
    app.router.add_get("/_sim/firewall/clock", admin_firewall_clock)
    app.router.add_post("/_sim/firewall/clock", admin_firewall_clock)
    app.router.add_get("/_sim/guests/{vmid:\\d+}", admin_guest)
    app.router.add_post("/_sim/k8s/expire-tokens", admin_k8s_expire_tokens)
    app.router.add_get("/_sim/k8s/clusters", admin_k8s_clusters)
    app.router.add_post("/_sim/guests/{vmid:\\d+}/addresses", admin_guest_address)
    app.router.add_delete("/_sim/guests/{vmid:\\d+}/addresses", admin_guest_address)
    app.router.add_post("/_sim/guests/{vmid:\\d+}/listen", admin_guest_listen)
    app.router.add_delete("/_sim/guests/{vmid:\\d+}/listen", admin_guest_listen)
    app.router.add_post("/_sim/appliance-faults", admin_appliance_fault)
    app.router.add_delete("/_sim/appliance-faults", admin_appliance_fault)
    app.router.add_post("/_sim/guest-faults", admin_guest_fault_add)
    app.router.add_get("/_sim/guest-faults", admin_guest_fault_list)
    app.router.add_delete("/_sim/guest-faults", admin_guest_fault_clear)
    app.router.add_delete("/_sim/guest-faults/{id:\\d+}", admin_guest_fault_delete)
    app.router.add_post("/_sim/sdn/reload-fault", admin_sdn_reload_fault)
    app.router.add_get("/_sim/sdn", admin_sdn_state)
    app.router.add_route("*", "/api2/json{tail:.*}", api_handler)
    return app
