"""The PVE firewall: the configuration the API exposes (VM firewall options, IP sets and rules, cluster
options) and what pve-firewall enforces from it (:func:`deliver`: would a packet be delivered?).

Source: pve-firewall ``src/PVE/API2/Firewall/{VM,IPSet,Cluster}.pm`` and ``PVE::Firewall``
(``copy_list_with_digest``, ``copy_opject_with_digest``) and pve-common ``PVE::Tools::assert_if_modified``.

State, as on a PVE cluster (``/etc/pve/firewall/<vmid>.fw`` and ``cluster.fw``):

- one :class:`VmFirewall` per **vmid** (``options``, ``ipsets`` name → entries, ``comments``). It is
  keyed by the vmid alone, like the file: the endpoints do not check that the VM exists (an unknown
  node name still fails), a clone copies the source's file (``clone_vmfw_conf``) and destroy removes it
  (``remove_vmfw_conf``) — :meth:`Firewall.clone` / :meth:`Firewall.remove`, called by the cluster.
- an entry is ``{cidr, comment?, nomatch?}``; a new entry goes to the **front** (PVE ``unshift``).
  Adding normalises the address as pve-firewall's ``create_ip`` does ("normalize like config parser,
  otherwise duplicates might slip through": ``parse_ip_or_cidr`` drops ``/32`` and ``/128``), so
  ``10.0.0.5/32`` is stored — and listed — as ``10.0.0.5`` and is a duplicate of it (community.proxmox#248
  met this). Read, update and delete compare the path's ``{cidr}`` as written: ``…/ipset/x/10.0.0.5/32``
  does not find ``10.0.0.5`` (DELETE of it succeeds and removes nothing).

Rules (``src/PVE/API2/Firewall/Rules.pm`` VMRules, ``src/PVE/Firewall.pm``): ``POST …/firewall/rules``
puts the new rule **first** (``unshift``; ``pos`` and ``digest`` are accepted and unused) and **disabled**
unless ``enable`` is given (``$rule->{enable} = 0 if !defined($param->{enable})``); ``PUT …/rules/{pos}``
checks ``digest``, then the position (500 ``no rule at position N``), then ``moveto`` (everything else
ignored) or sets the given fields (``''``/``-`` delete one, ``delete=`` too: 400 ``no such property
('x')`` / ``unable to delete required property 'type'``); ``DELETE …/rules/{pos}`` checks ``digest`` then
the position. Each write is verified as ``verify_rule`` does (the first error: 400 ``errors.<field>``,
e.g. ``dport``: ``protocol 'vrrp' does not support ports``, ``proto``: ``missing property - 'dport'
requires this property``) after the schema's formats (:mod:`z9.sim.firewall_formats`). A rule is stored
as the file round trip leaves it (``enable`` 0/1, ``ipversion`` when the addresses or protocol fix it).

Enforcement: pve-firewall's daemon recompiles every 10 s (``src/PVE/Service/pve_firewall.pm``
``$updatetime = 10``): :class:`Firewall` keeps the last compile (:class:`Compiled`) taken on its
:class:`FirewallClock`, and :func:`deliver` / :func:`exchange` judge packets by it — an API write is
enforced from the next cycle on (``POST /_sim/firewall/clock`` steps a manual clock).

Error texts (HTTP status):

- missing set → 500 ``no such IPSet '<name>'``; duplicate set → 400 ``errors.name = "IPSet '<name>' already
  exists"``; deleting a set with entries (without ``force``) → 500 ``IPSet '<name>' is not empty``.
- duplicate entry → 400 ``errors.cidr = "address '<cidr>' already exists"``; ``/0`` → 400 ``errors.cidr =
  "a zero prefix is not allowed in ipset entries"``; read/update of a missing entry → 400 ``errors.cidr =
  "no such IP/Network"`` (DELETE of a missing entry succeeds, as in PVE); an alias name that is not
  defined → 500 ``no such alias '<name>'``.
- ``digest`` that does not match → 500 ``detected modified configuration - file changed by other user? Try
  again.``; ``delete`` of an unknown option → 400 ``errors.delete = "no such option '<opt>'"``.
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import PveError, param_error
from .firewall_formats import (
    ALIAS_REF_RE,
    ICMP_TYPES,
    ICMPV6_TYPES,
    IPSET_REF_RE,
    MACROS,
    PROTOCOLS,
    PROTOCOLS_WITH_PORTS,
    RULE_PROPERTIES,
    SECURITY_GROUP_RE,
    _fmt_iface,
    _fmt_proto,
    parse_address_list,
    parse_ports,
)

VM_OPTIONS = ("dhcp", "enable", "ipfilter", "log_level_in", "log_level_out", "macfilter", "ndp", "policy_in",
              "policy_out", "radv")
CLUSTER_OPTIONS = ("ebtables", "enable", "log_ratelimit", "policy_forward", "policy_in", "policy_out")
INT_OPTIONS = {"dhcp", "enable", "ipfilter", "macfilter", "ndp", "radv", "ebtables"}
ALIAS_RE = re.compile(r"(?:dc/|guest/)?[A-Za-z][A-Za-z0-9\-_]+")
MODIFIED = "detected modified configuration - file changed by other user? Try again."


def split_list(text: str) -> list[str]:
    """PVE::Tools::split_list: separators are ``,`` ``;`` and whitespace; empty items dropped."""
    return [p for p in re.split(r"[,;\s]+", text or "") if p]


def list_digest(entries: list[dict]) -> tuple[list[dict], str]:
    """``PVE::Firewall::copy_list_with_digest``: sha1 over ``k:v\\n`` of each entry's sorted keys."""
    sha = hashlib.sha1()
    out = []
    for e in entries:
        d = {}
        for k in sorted(e):
            v = e[k]
            if v is None:
                continue
            d[k] = v
            sha.update(f"{k}:{v}\n".encode())
        out.append(d)
    digest = sha.hexdigest()
    for d in out:
        d["digest"] = digest
    return out, digest


def object_digest(obj: dict) -> tuple[dict, str]:
    """``PVE::Firewall::copy_opject_with_digest`` (sic)."""
    sha = hashlib.sha1()
    out = {}
    for k in sorted(obj):
        v = obj[k]
        if v is None:
            continue
        out[k] = v
        sha.update(f"{k}:{v}\n".encode())
    digest = sha.hexdigest()
    out["digest"] = digest
    return out, digest


def normalize_cidr(cidr: str) -> str:
    """``PVE::Firewall::parse_ip_or_cidr``: a host prefix is dropped (``10.0.0.5/32`` → ``10.0.0.5``,
    ``2001:db8::1/128`` → ``2001:db8::1``); anything else is kept as written."""
    if ":" in cidr:
        return re.sub(r"/128$", "", cidr)
    return re.sub(r"/32$", "", cidr)


def mac_to_linklocal(mac: str) -> str:
    """``PVE::Firewall::mac_to_linklocal``: fe80::/64 with the modified EUI-64 of ``mac`` (the
    universal/local bit flipped, ``ff:fe`` in the middle; RFC 4291)."""
    import ipaddress

    b = [int(x, 16) for x in mac.split(":")]
    b[0] ^= 2
    eui = b[:3] + [0xFF, 0xFE] + b[3:]
    return str(ipaddress.IPv6Address("fe80::" + ":".join(f"{eui[i] << 8 | eui[i + 1]:x}" for i in range(0, 8, 2))))


def assert_if_modified(current: str, given: str | None) -> None:
    if given and given != current:
        raise PveError(500, MODIFIED)


def _typed(options: dict[str, str]) -> dict:
    return {k: (int(v) if k in INT_OPTIONS and re.fullmatch(r"-?\d+", v) else v) for k, v in options.items()}


@dataclass
class VmFirewall:
    options: dict[str, str] = field(default_factory=dict)
    ipsets: dict[str, list[dict]] = field(default_factory=dict)
    comments: dict[str, str] = field(default_factory=dict)
    # the ``[RULES]`` section, in order: each rule as ``parse_fw_rule`` reads it back from the file
    rules: list[dict] = field(default_factory=list)
    # the cluster's IP sets (cluster.fw ``[IPSET <name>]``) as the rules see them (``+dc/<name>``): not
    # part of the VM's file; set by the cluster before a rule is verified and in every compile
    dc_ipsets: dict[str, list[dict]] = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"options": dict(self.options), "ipsets": copy.deepcopy(self.ipsets), "comments": dict(self.comments),
                "rules": copy.deepcopy(self.rules)}

    @classmethod
    def from_json(cls, d: dict) -> VmFirewall:
        return cls(dict(d.get("options") or {}), copy.deepcopy(d.get("ipsets") or {}), dict(d.get("comments") or {}),
                   copy.deepcopy(d.get("rules") or []))


class FirewallClock:
    """The clock pve-firewall's daemon cycles on: seconds since the simulator started (``manual``: only
    what :meth:`advance` added — a test steps it, nothing moves by itself)."""

    def __init__(self, manual: bool = False) -> None:
        self.manual = manual
        self.offset = 0.0
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (0.0 if self.manual else time.monotonic() - self._t0) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds

    def set_manual(self, manual: bool) -> None:
        """Switch between the real and the manual clock; ``now`` goes on from where it is."""
        now = self.now()
        self.manual = manual
        self.offset += now - self.now()


# pve-firewall src/PVE/Service/pve_firewall.pm: ``my $updatetime = 10;`` — the daemon's loop runs
# ``PVE::Firewall::update()`` (compile + apply) then waits until ``time() + $updatetime``
CYCLE_S = 10.0


@dataclass
class Compiled:
    """What one ``PVE::Firewall::update()`` compiled: the cluster ``enable``, each VM's firewall file
    (those with ``enable: 1`` only: ``compile_iptables_filter`` skips the others) and each VM's NICs
    (``read_local_vm_config``: the ``netN`` lines it builds tap chains from)."""

    at: float
    cycle: int
    enabled: bool
    vms: dict[int, VmFirewall]
    nics: dict[int, dict[str, str]]


class Firewall:
    """Cluster-wide firewall state (VM files by vmid + cluster options), and what pve-firewall last
    compiled from it (:meth:`compiled`)."""

    def __init__(self, clock: FirewallClock | None = None) -> None:
        self.vms: dict[int, VmFirewall] = {}
        self.cluster_options: dict[str, str] = {}
        # cluster.fw ``[IPSET <name>]`` sections (``/cluster/firewall/ipset``): name → entries, and comments
        self.cluster_ipsets: dict[str, list[dict]] = {}
        self.cluster_ipset_comments: dict[str, str] = {}
        self.clock = clock or FirewallClock()
        # the VMs' configs by vmid (set by the cluster): what the compile reads the NICs from
        self.vm_configs: Callable[[], Mapping[int, Mapping[str, str]]] = dict
        self._compiled: Compiled | None = None

    # ---- lifecycle hooks (clone / destroy / reset / persistence) ----------------------------------
    def clone(self, src: int, dst: int) -> None:
        """``clone_vmfw_conf``: the target gets a copy of the source's file (or none)."""
        self.tick()
        if src in self.vms:
            self.vms[dst] = VmFirewall.from_json(self.vms[src].to_json())
        else:
            self.vms.pop(dst, None)

    def remove(self, vmid: int) -> None:
        self.tick()
        self.vms.pop(vmid, None)

    def clear(self) -> None:
        self.vms.clear()
        self.cluster_options.clear()
        self.cluster_ipsets.clear()
        self.cluster_ipset_comments.clear()
        self._compiled = None  # a fresh world: the daemon compiles it at its next look

    # ---- the daemon's cycle ------------------------------------------------------------------------
    def tick(self) -> None:
        """pve-firewall's loop (``pve_firewall.pm`` ``run``: ``update()`` every ``$updatetime`` = 10 s):
        when the clock has entered a cycle the last compile did not see, compile the state as it is now.
        Called before every write (so a write lands after the compile of its cycle) and before every
        read of :meth:`compiled` — a write is enforced from the next cycle boundary on, never before."""
        cycle = math.floor(self.clock.now() / CYCLE_S)
        if self._compiled is None or cycle != self._compiled.cycle:
            self._compiled = self._compile(cycle)

    def _compile(self, cycle: int) -> Compiled:
        enabled = str(self.cluster_options.get("enable", "0")) not in ("0", "")
        configs = self.vm_configs()
        vms = {vmid: VmFirewall.from_json(fw.to_json()) for vmid, fw in self.vms.items()
               if str(fw.options.get("enable", "0")) not in ("0", "")} if enabled else {}
        dc = copy.deepcopy(self.cluster_ipsets)  # compile_ipsets: the cluster's sets, as they are now
        for fw in vms.values():
            fw.dc_ipsets = dc
        nics = {vmid: {k: str(v) for k, v in configs[vmid].items() if re.fullmatch(r"net\d+", k)}
                for vmid in vms if vmid in configs}
        return Compiled(self.clock.now(), cycle, enabled, vms, nics)

    def compiled(self) -> Compiled:
        """What the firewall enforces now (the last cycle's compile)."""
        self.tick()
        assert self._compiled is not None
        return self._compiled

    def next_cycle_in(self) -> float:
        """Seconds until the daemon's next compile."""
        now = self.clock.now()
        return (math.floor(now / CYCLE_S) + 1) * CYCLE_S - now

    def dump(self) -> dict:
        return {"vms": {str(k): v.to_json() for k, v in sorted(self.vms.items())},
                "cluster_options": dict(self.cluster_options),
                "cluster_ipsets": copy.deepcopy(self.cluster_ipsets),
                "cluster_ipset_comments": dict(self.cluster_ipset_comments)}

    def load(self, d: dict) -> None:
        self.vms = {int(k): VmFirewall.from_json(v) for k, v in (d.get("vms") or {}).items()}
        self.cluster_options = dict(d.get("cluster_options") or {})
        self.cluster_ipsets = copy.deepcopy(d.get("cluster_ipsets") or {})
        self.cluster_ipset_comments = dict(d.get("cluster_ipset_comments") or {})

    def vm(self, vmid: int) -> VmFirewall:
        """The VM's firewall file as ``load_vmfw_conf`` reads it (empty when absent; not created), the
        cluster's IP sets beside it (what its rules' ``+dc/<name>`` refer to)."""
        fw = self.vms.get(vmid) or VmFirewall()
        fw.dc_ipsets = self.cluster_ipsets
        return fw

    # ---- cluster IP sets (API2/Firewall/IPSet.pm ClusterIPSetList / ClusterIPset: cluster.fw) ------
    # The same handlers as a VM's sets (``register_*`` in IPSet.pm are shared by both levels), on the
    # cluster's file: the same texts, ``Sys.Audit``/``Sys.Modify`` on ``/`` (the schema's permissions).
    def _dc(self) -> VmFirewall:
        return VmFirewall(ipsets=self.cluster_ipsets, comments=self.cluster_ipset_comments)

    def list_cluster_ipsets(self) -> list[dict]:
        fw = self._dc()
        return list_digest([{"name": n, **({"comment": fw.comments[n]} if fw.comments.get(n) else {})}
                            for n in sorted(fw.ipsets)])[0]

    def create_cluster_ipset(self, params: dict[str, str]) -> None:
        self.tick()
        name = params["name"]
        if params.get("rename"):
            raise param_error({"rename": "renaming cluster IP sets is not modelled"})
        if name in self.cluster_ipsets:
            raise param_error({"name": f"IPSet '{name}' already exists"})
        self.cluster_ipsets[name] = []
        if "comment" in params:
            self.cluster_ipset_comments[name] = params["comment"]

    def _cluster_ipset(self, name: str) -> list[dict]:
        if name not in self.cluster_ipsets:
            raise PveError(500, f"no such IPSet '{name}'")
        return self.cluster_ipsets[name]

    def get_cluster_ipset(self, name: str) -> list[dict]:
        return list_digest(self._cluster_ipset(name))[0]

    def delete_cluster_ipset(self, name: str, force: bool = False) -> None:
        """``delete_ipset``: a set still holding entries needs ``force``; a set a VM's rule names is
        deleted all the same (the rule then fails to compile: ``no such ipset``, warned and left out)."""
        self.tick()
        if self._cluster_ipset(name) and not force:
            raise PveError(500, f"IPSet '{name}' is not empty")
        del self.cluster_ipsets[name]
        self.cluster_ipset_comments.pop(name, None)

    def add_cluster_ip(self, name: str, params: dict[str, str]) -> None:
        self.tick()
        entries = self._cluster_ipset(name)
        cidr = normalize_cidr(params["cidr"])
        if any(e["cidr"] == cidr for e in entries):
            raise param_error({"cidr": f"address '{cidr}' already exists"})
        if re.search(r"/0+$", cidr):
            raise param_error({"cidr": "a zero prefix is not allowed in ipset entries"})
        entry: dict = {"cidr": cidr}
        if params.get("nomatch") == "1":
            entry["nomatch"] = 1
        if params.get("comment"):
            entry["comment"] = params["comment"]
        entries.insert(0, entry)

    def remove_cluster_ip(self, name: str, cidr: str, params: dict[str, str]) -> None:
        self.tick()
        entries = self._cluster_ipset(name)
        assert_if_modified(list_digest(entries)[1], params.get("digest"))
        self.cluster_ipsets[name] = [e for e in entries if e["cidr"] != cidr]

    def _save(self, vmid: int, fw: VmFirewall) -> None:
        self.vms[vmid] = fw

    # ---- enforcement: the IP filter ---------------------------------------------------------------
    def refuses_source(self, vmid: int, vm_config: dict, ip: str, nic: str = "net0") -> bool:
        """True when the VM's IP filter drops what its guest sends from ``ip`` on ``nic``.

        pve-firewall ``src/PVE/Firewall.pm`` (at 6f1311f3): with the datacenter firewall on
        (``cluster.fw`` ``enable: 1``; off, no VM rule is compiled), the VM's firewall on (``enable:
        1``: ``generate_tap_rules`` creates the tap's chain only then) and the NIC's ``firewall=1``
        (qemu-server ``net[n]``: the tap goes through the firewall bridge only then), the tap's
        outgoing chain drops every packet whose source is not in the IP set ``ipfilter-<nic>``
        (``ruleset_create_vm_chain``: ``-m set ! --match-set PVEFW-<vmid>-ipfilter-<nic>-v4 src -j
        DROP``, :2633) — compiled when ``ipfilter: 1`` **or when that set exists at all**
        (``generate_tap_rules`` :2798: ``if $options->{ipfilter} || $vmfw_conf->{ipset}->{$ipfilter_name}``;
        the option "is equivalent to adding an empty ipfilter-net<id> ipset"). ``compile_ipsets``
        (:4514-4536) adds to every such set the NIC's IPv6 link-local address derived from its MAC
        (``mac_to_linklocal``, RFC 4291 modified EUI-64) and ``fe80::/10`` as ``nomatch``: no other
        link-local address passes. An entry may be a network (``10.0.0.0/24``); ``nomatch``
        excludes (ipset semantics). Reads the configuration as it is now, not the daemon's last
        compile (what the appliance and kubeadm models ask of an address a guest answers from); the
        question of :func:`deliver` applies the same filter as compiled (:func:`ipfilter_refuses`)."""
        if str(self.cluster_options.get("enable", "0")) != "1":
            return False
        fw = self.vm(vmid)
        if str(fw.options.get("enable", "0")) != "1":
            return False
        net = str(vm_config.get(nic, ""))
        if "firewall=1" not in net.split(","):
            return False
        return ipfilter_refuses(fw, net, nic, ip)

    # ---- options ---------------------------------------------------------------------------------
    def get_vm_options(self, vmid: int) -> dict:
        out, _ = object_digest(self.vm(vmid).options)
        return _typed({k: v for k, v in out.items() if k != "digest"}) | {"digest": out["digest"]}

    def set_vm_options(self, vmid: int, params: dict[str, str]) -> None:
        self.tick()
        fw = self.vm(vmid)
        _, digest = object_digest(fw.options)
        assert_if_modified(digest, params.get("digest"))
        self._set_options(fw.options, VM_OPTIONS, params)
        self._save(vmid, fw)

    def get_cluster_options(self) -> dict:
        out, _ = object_digest(self.cluster_options)
        return _typed({k: v for k, v in out.items() if k != "digest"}) | {"digest": out["digest"]}

    def set_cluster_options(self, params: dict[str, str]) -> None:
        self.tick()
        _, digest = object_digest(self.cluster_options)
        assert_if_modified(digest, params.get("digest"))
        self._set_options(self.cluster_options, CLUSTER_OPTIONS, params)

    @staticmethod
    def _set_options(options: dict[str, str], known: tuple[str, ...], params: dict[str, str]) -> None:
        deletes = split_list(params.get("delete", ""))
        for opt in deletes:
            if opt not in known:
                raise param_error({"delete": f"no such option '{opt}'"})
        for opt in deletes:
            options.pop(opt, None)
        for k in known:
            if k in params:
                v = params[k]
                if k == "enable" and known is VM_OPTIONS:
                    v = "1" if v not in ("0", "") else "0"
                options[k] = v

    # ---- IP sets ---------------------------------------------------------------------------------
    def list_ipsets(self, vmid: int) -> list[dict]:
        fw = self.vm(vmid)
        rows = []
        for name in sorted(fw.ipsets):
            d = {"name": name}
            if fw.comments.get(name):
                d["comment"] = fw.comments[name]
            rows.append(d)
        return list_digest(rows)[0]

    def create_ipset(self, vmid: int, params: dict[str, str]) -> None:
        self.tick()
        fw = self.vm(vmid)
        name = params["name"]
        rename = params.get("rename")
        if rename:
            rows = [{"name": n, **({"comment": fw.comments[n]} if fw.comments.get(n) else {})} for n in sorted(fw.ipsets)]
            assert_if_modified(list_digest(rows)[1], params.get("digest"))
            if rename not in fw.ipsets:
                raise param_error({"name": f"IPSet '{rename}' does not exists"})
            if name in fw.ipsets and name != rename:
                raise param_error({"name": f"IPSet '{name}' does already exist"})
            fw.ipsets[name] = fw.ipsets.pop(rename)
            if rename in fw.comments:
                fw.comments[name] = fw.comments.pop(rename)
            if "comment" in params:
                fw.comments[name] = params["comment"]
        else:
            if name in fw.ipsets:
                raise param_error({"name": f"IPSet '{name}' already exists"})
            fw.ipsets[name] = []
            if "comment" in params:
                fw.comments[name] = params["comment"]
        self._save(vmid, fw)

    def _ipset(self, vmid: int, name: str) -> tuple[VmFirewall, list[dict]]:
        fw = self.vm(vmid)
        if name not in fw.ipsets:
            raise PveError(500, f"no such IPSet '{name}'")
        return fw, fw.ipsets[name]

    def get_ipset(self, vmid: int, name: str) -> list[dict]:
        _, entries = self._ipset(vmid, name)
        out, _ = list_digest(entries)
        for e in out:
            if "nomatch" in e:
                e["nomatch"] = int(e["nomatch"])
        return out

    def delete_ipset(self, vmid: int, name: str, force: bool = False) -> None:
        self.tick()
        fw, entries = self._ipset(vmid, name)
        if entries and not force:
            raise PveError(500, f"IPSet '{name}' is not empty")
        del fw.ipsets[name]
        fw.comments.pop(name, None)
        self._save(vmid, fw)

    def add_ip(self, vmid: int, name: str, params: dict[str, str]) -> None:
        self.tick()
        fw, entries = self._ipset(vmid, name)
        cidr = params["cidr"]
        if not ALIAS_RE.fullmatch(cidr):  # parse_ip_or_cidr: normalised like the config parser
            cidr = normalize_cidr(cidr)
        if any(e["cidr"] == cidr for e in entries):
            raise param_error({"cidr": f"address '{cidr}' already exists"})
        if re.search(r"/0+$", cidr):
            raise param_error({"cidr": "a zero prefix is not allowed in ipset entries"})
        if ALIAS_RE.fullmatch(cidr):
            raise PveError(500, f"no such alias '{cidr.split('/')[-1]}'")
        entry: dict = {"cidr": cidr}
        if params.get("nomatch") == "1":
            entry["nomatch"] = 1
        if params.get("comment"):
            entry["comment"] = params["comment"]
        entries.insert(0, entry)
        self._save(vmid, fw)

    def read_ip(self, vmid: int, name: str, cidr: str) -> dict:
        for e in self.get_ipset(vmid, name):
            if e["cidr"] == cidr:
                return e
        raise param_error({"cidr": "no such IP/Network"})

    def update_ip(self, vmid: int, name: str, cidr: str, params: dict[str, str]) -> None:
        self.tick()
        fw, entries = self._ipset(vmid, name)
        assert_if_modified(list_digest(entries)[1], params.get("digest"))
        for e in entries:
            if e["cidr"] == cidr:
                e.pop("nomatch", None)
                e.pop("comment", None)
                if params.get("nomatch") == "1":
                    e["nomatch"] = 1
                if params.get("comment"):
                    e["comment"] = params["comment"]
                self._save(vmid, fw)
                return
        raise param_error({"cidr": "no such IP/Network"})

    def remove_ip(self, vmid: int, name: str, cidr: str, params: dict[str, str]) -> None:
        self.tick()
        fw, entries = self._ipset(vmid, name)
        assert_if_modified(list_digest(entries)[1], params.get("digest"))
        fw.ipsets[name] = [e for e in entries if e["cidr"] != cidr]
        self._save(vmid, fw)


    # ---- rules (Rules.pm VMRules) ------------------------------------------------------------------
    def list_rules(self, vmid: int) -> list[dict]:
        """``get_rules``: ``copy_list_with_digest`` of the rules, each with its ``pos``."""
        out, _ = list_digest(self.vm(vmid).rules)
        for i, r in enumerate(out):
            r["pos"] = i
        return out

    def get_rule(self, vmid: int, pos: int) -> dict:
        out = self.list_rules(vmid)
        if pos >= len(out):
            raise PveError(500, f"no rule at position {pos}")
        return out[pos]

    def create_rule(self, vmid: int, params: dict[str, str]) -> None:
        """``create_rule``: verified, ``enable: 0`` when not given, and put **first** (``unshift``; the
        ``pos`` parameter is copied into the rule by ``copy_rule_data`` but not used, nor is
        ``digest`` checked)."""
        self.tick()
        fw = self.vm(vmid)
        rule = copy_rule_data({}, params)
        verify_rule(rule, fw)
        if params.get("enable") is None:
            rule["enable"] = 0
        fw.rules.insert(0, stored_rule(rule, fw))
        self._save(vmid, fw)

    def update_rule(self, vmid: int, pos: int, params: dict[str, str]) -> None:
        """``update_rule``: digest, then position; ``moveto`` moves the rule (everything else ignored),
        else the given properties are set, ``delete`` removes some, and the rule is verified again."""
        self.tick()
        fw = self.vm(vmid)
        assert_if_modified(list_digest(fw.rules)[1], params.get("digest"))
        if pos >= len(fw.rules):
            raise PveError(500, f"no rule at position {pos}")
        rule = fw.rules[pos]
        moveto = params.get("moveto")
        if moveto is not None and int(moveto) != pos:
            to = int(moveto)
            rest = [r for i, r in enumerate(fw.rules) if i != pos]
            new: list[dict] = []
            for i, r in enumerate(fw.rules):
                if i == pos:
                    continue
                if i == to:
                    new.append(rule)
                new.append(r)
            if to >= len(fw.rules):
                new.append(rule)
            assert len(new) == len(rest) + 1
            fw.rules = new
        else:
            rule = copy_rule_data(copy.deepcopy(rule), params)
            rule.pop("errors", None)
            for opt in split_list(params.get("delete", "")):
                if opt not in RULE_PROPERTIES:
                    raise param_error({"delete": f"no such property ('{opt}')"})
                if opt in ("type", "action"):
                    raise param_error({"delete": f"unable to delete required property '{opt}'"})
                rule.pop(opt, None)
            verify_rule(rule, fw)
            fw.rules[pos] = stored_rule(rule, fw)
        self._save(vmid, fw)

    def delete_rule(self, vmid: int, pos: int, params: dict[str, str]) -> None:
        self.tick()
        fw = self.vm(vmid)
        assert_if_modified(list_digest(fw.rules)[1], params.get("digest"))
        if pos >= len(fw.rules):
            raise PveError(500, f"no rule at position {pos}")
        del fw.rules[pos]
        self._save(vmid, fw)


# ================================================================================================
# Rules: the VM's ``[RULES]`` section (pve-firewall ``src/PVE/API2/Firewall/Rules.pm`` VMRules and
# ``src/PVE/Firewall.pm`` at 6f1311f3: ``$rule_properties``, ``verify_rule``, ``copy_rule_data``,
# ``delete_rule_properties``, ``$format_rules``/``parse_fw_rule``)
# ================================================================================================

def _is_icmp(proto: str | None) -> bool:
    return proto in ("icmp", "icmpv6", "ipv6-icmp")


def verify_rule(rule: dict, fw: VmFirewall, noerr: bool = False) -> dict:
    """``verify_rule($rule, $cluster_conf, $fw_conf, 'vm', $noerr)``: the first error raises 400
    ``Parameter verification failed.`` with ``errors.<param>`` (``$noerr``: collected into
    ``rule["errors"]`` instead, as the config parser does). Sets ``ipversion`` when determined."""
    errors: dict[str, str] = dict(rule.get("errors") or {})
    count = 0

    def add(param: str, msg: str) -> None:
        nonlocal count
        msg = msg.rstrip("\n")
        if not noerr:
            raise param_error({param: msg})
        count += 1
        errors.setdefault(param, msg)

    ipversion: int | None = None

    def set_version(v: int | None) -> None:
        nonlocal ipversion
        if v:
            if ipversion and v != ipversion:
                raise PveError(500, "detected mixed ipv4/ipv6 addresses in rule")
            ipversion = v

    def check_ref(name: str) -> None:
        value = rule.get(name)
        if not value:
            return
        if value.startswith("+"):
            m = IPSET_REF_RE.fullmatch(value)
            if m:
                # check_ipset_ref: ``+dc/<name>`` a cluster set, ``+<name>``/``+guest/<name>`` the VM's
                # own, then the cluster's (Firewall.pm resolve order); no SDN sets are modelled
                scope, set_name = m.group(1) or "", m.group(2)
                known = (set_name in fw.dc_ipsets if scope == "dc/" else
                         set_name in fw.ipsets or (scope == "" and set_name in fw.dc_ipsets))
                if not known:
                    add(name, f"no such ipset '{set_name}'")
            else:
                add(name, f"invalid ipset name '{value}'")
        elif ALIAS_REF_RE.fullmatch(value):
            add(name, f"no such alias '{value}'")  # no aliases are modelled (cluster or VM)

    typ, action = rule.get("type"), rule.get("action")
    if not typ:
        add("type", "missing property")
    if not action:
        add("action", "missing property")
    if typ:
        if typ not in ("in", "out", "group"):
            add("type", f"invalid rule type '{typ}' for rule_env 'vm'")
        if typ in ("in", "out") and action and not re.fullmatch(r"ACCEPT|DROP|REJECT", action):
            add("action", f"unknown action '{action}'")
        if typ == "group" and action and not SECURITY_GROUP_RE.fullmatch(action):
            add("action", "invalid characters in security group name")
    if rule.get("iface"):
        try:
            _fmt_iface(rule["iface"])
        except ValueError as e:
            add("iface", str(e))
        if not re.fullmatch(r"net(\d+)", rule["iface"]):
            add("iface", "value does not match the regex pattern 'net\\d+'")
    if rule.get("macro"):
        name = next((n for n in MACROS if n.lower() == rule["macro"].lower()), None)
        if name:
            rule["macro"] = name
        else:
            add("macro", f"unknown macro '{rule['macro']}'")
    is_icmp = False
    proto = rule.get("proto")
    if proto:
        try:
            _fmt_proto(proto)
        except ValueError as e:
            add("proto", str(e))
        set_version(4 if proto == "icmp" else 6 if proto in ("icmpv6", "ipv6-icmp") else None)
        is_icmp = _is_icmp(proto)
    if rule.get("dport"):
        try:
            parse_ports(rule["dport"], is_icmp)
        except ValueError as e:
            add("dport", str(e))
        if not proto:
            add("proto", "missing property - 'dport' requires this property")
        if proto not in PROTOCOLS_WITH_PORTS and not is_icmp:
            add("dport", f"protocol '{proto}' does not support ports")
    if rule.get("icmp-type"):
        icmp_type = rule["icmp-type"]
        if not is_icmp:
            add("proto", "missing property - 'icmp-type' requires this property")
        if rule.get("dport"):
            add("icmp-type", "'icmp-type' cannot be specified together with 'dport'")
        if proto == "icmp" and icmp_type not in ICMP_TYPES:
            add("icmp-type", f"invalid icmp-type '{icmp_type}' for proto 'icmp'")
        elif proto in ("icmpv6", "ipv6-icmp") and icmp_type not in ICMPV6_TYPES:
            add("icmp-type", f"invalid icmp-type '{icmp_type}' for proto '{proto}'")
    if rule.get("sport"):
        try:
            parse_ports(rule["sport"], False)
        except ValueError as e:
            add("sport", str(e))
        if not proto:
            add("proto", "missing property - 'sport' requires this property")
        if proto not in PROTOCOLS_WITH_PORTS:
            add("sport", f"protocol '{proto}' does not support ports")
    for name in ("source", "dest"):
        if rule.get(name):
            try:
                set_version(parse_address_list(rule[name]))
            except ValueError as e:
                add(name, str(e))
            check_ref(name)
    if ipversion:
        rule["ipversion"] = ipversion
    if rule.get("macro") and not count:
        for k, v in _macro_conflicts(rule).items():
            add(k, v)
    if count:
        rule["errors"] = errors
    return rule


def _macro_conflicts(rule: dict) -> dict[str, str]:
    """``$apply_macro`` with ``$verify``: a parameter the macro defines must not be given otherwise."""
    out: dict[str, str] = {}
    for templ in MACROS.get(rule["macro"], []):
        for k, v in templ.items():
            if rule.get(k) not in (None, "") and rule[k] != v:
                out.setdefault(k, f"parameter '{k}' already define in macro (value = '{v}')")
    return out


def copy_rule_data(rule: dict, params: dict[str, str]) -> dict:
    """``copy_rule_data``: each rule property given is set; ``''`` or ``-`` deletes it."""
    for k in RULE_PROPERTIES:
        v = params.get(k)
        if v is None:
            continue
        if v in ("", "-"):
            rule.pop(k, None)
        else:
            rule[k] = v
    return rule


def stored_rule(rule: dict, fw: VmFirewall) -> dict:
    """The rule as ``save_vmfw_conf`` writes it (``$format_rules``) and ``parse_fw_rule`` reads it back:
    ``enable`` 0/1, a group rule without matches, a blank comment dropped, ``ipversion`` and ``errors``
    recomputed; ``pos``/``digest`` (copied from the parameters) are not kept."""
    out: dict = {}
    comment = str(rule.get("comment") or "")
    if comment.strip():
        out["comment"] = comment.strip()
    out["enable"] = 0 if rule.get("enable") is not None and str(rule["enable"]) in ("0", "") else 1
    out["type"] = str(rule["type"]).lower()
    out["action"] = rule["action"]
    if rule.get("macro"):
        out["macro"] = rule["macro"]
    if rule.get("iface"):
        out["iface"] = rule["iface"]
    if out["type"] != "group":
        for k in ("source", "dest", "proto", "dport", "sport", "log"):
            if rule.get(k):
                out[k] = rule[k]
        if rule.get("icmp-type") not in (None, ""):
            out["icmp-type"] = rule["icmp-type"]
    return verify_rule(out, fw, noerr=True)


# ================================================================================================
# Enforcement: would a packet be delivered? (pve-firewall ``src/PVE/Firewall.pm`` at 6f1311f3)
# ================================================================================================
#
# A packet between two guests on the bridge crosses PVEFW-FORWARD once per host: first
# ``ruleset_chain_add_conn_filters`` (``-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT``: a reply
# or a packet of a known flow passes before any VM chain — replies to what a guest opened always
# pass), then PVEFW-FWBR-OUT → the sender's ``tap…-OUT`` chain and PVEFW-FWBR-IN → the receiver's
# ``tap…-IN`` chain (``generate_tap_rules_direction``). The question below is asked for a NEW
# connection (its first packet): the sender's OUT chain (if the sender is a guest), then the
# receiver's IN chain. REJECT (``PVEFW-reject``) and DROP both mean "not delivered".

EPHEMERAL_SPORT = None  # a client's source port is not asked: a rule with ``sport`` does not match it


@dataclass
class Packet:
    src: Any  # ipaddress.IPv4Address | IPv6Address
    dst: Any | None
    proto: str  # a name or a number, as asked
    dport: int | None = None
    sport: int | None = None

    @property
    def version(self) -> int:
        return int(self.src.version)

    @property
    def proto_num(self) -> int | None:
        return proto_number(self.proto)


def proto_number(p: str | None) -> int | None:
    if p is None:
        return None
    if p in ("icmpv6", "ipv6-icmp"):
        return 58
    if p in PROTOCOLS:
        return PROTOCOLS[p]
    return int(p) if p.isdigit() else None


@dataclass
class ChainVerdict:
    accepted: bool
    reason: str
    rejected: bool = False  # REJECT (``PVEFW-reject``: a TCP reset, an ICMP unreachable) rather than DROP


def _ports_match(spec: str, port: int | None, icmp: bool) -> bool:
    if icmp:  # the question's ICMP packet is an echo-request (ping)
        return any(p in ("echo-request", "any") or p == (8, 8) for p in parse_ports(spec, True))
    if port is None:
        return False
    return any(isinstance(p, tuple) and p[0] <= port <= p[1] for p in parse_ports(spec, False))


def ipset_matches(entries: list[dict], addr: Any) -> bool:
    """ipset ``hash:net`` as ``compile_ipsets`` fills it (one set per IP version): the most specific
    entry holding ``addr`` decides, a ``nomatch`` one excludes it."""
    import ipaddress

    best: tuple[int, bool] | None = None
    for e in entries:
        try:
            net = ipaddress.ip_network(str(e["cidr"]), strict=False)
        except ValueError:
            continue  # an alias: none are modelled
        if net.version == addr.version and addr in net and (best is None or net.prefixlen > best[0]):
            best = (net.prefixlen, bool(e.get("nomatch")))
    return best is not None and not best[1]


class RuleNotCompiled(Exception):
    """``ipt_rule_to_cmds`` died for this rule (``no such ipset``, ``no such alias``): the daemon warns
    and the rule is left out of the chain (``ruleset_generate_vm_rules``: ``eval { … }; warn $@``)."""


def _addr_matches(spec: str, addr: Any, fw: VmFirewall) -> bool:
    """``ipt_gen_src_or_dst_match``: ``+set`` (the VM's own; ``+dc/``/``+sdn/`` sets are the
    cluster's, and the simulator has none), an alias (none modelled), a range ``a-b``, or a list."""
    import ipaddress

    if addr is None:
        return False
    if spec.startswith("+"):
        m = IPSET_REF_RE.fullmatch(spec)
        if m is None:
            raise RuleNotCompiled(f"invalid security group name '{spec}'")
        scope, name = m.group(1) or "", m.group(2)
        if scope in ("", "guest/") and name in fw.ipsets:
            return ipset_matches(fw.ipsets[name], addr)
        if scope in ("", "dc/") and name in fw.dc_ipsets:  # the cluster's (compile_ipsets: PVEFW-<name>)
            return ipset_matches(fw.dc_ipsets[name], addr)
        raise RuleNotCompiled(f"no such ipset '{name}'")
    if ALIAS_REF_RE.fullmatch(spec):
        raise RuleNotCompiled(f"no such alias '{spec}'")
    if "-" in spec:
        a, b = (ipaddress.ip_address(x.strip()) for x in spec.split("-", 1))
        return a.version == addr.version and int(a) <= int(addr) <= int(b)
    for elem in spec.split(","):
        net = ipaddress.ip_network(elem, strict=False)
        if net.version == addr.version and addr in net:
            return True
    return False


def _rule_text(i: int, r: dict) -> str:
    parts = [f"rule {i}:", r["type"].upper(), f"{r['macro']}({r['action']})" if r.get("macro") else r["action"]]
    for k in ("iface", "source", "dest", "proto", "dport", "sport", "icmp-type"):
        if r.get(k):
            parts.append(f"-{k} {r[k]}")
    if r.get("comment"):
        parts.append(f"# {r['comment']}")
    return " ".join(parts)


def _rule_matches(r: dict, pkt: Packet, fw: VmFirewall) -> bool:
    """One rule (a macro expanded into its rules: any of them) against the packet."""
    templates = MACROS.get(r.get("macro") or "", [{}]) if r.get("macro") else [{}]
    for t in templates:
        e = {**r, **t}
        proto = e.get("proto")
        if proto and proto_number(proto) != pkt.proto_num:
            continue
        icmp = _is_icmp(proto)
        if e.get("dport") and not _ports_match(e["dport"], pkt.dport, icmp):
            continue
        if e.get("sport") and not _ports_match(e["sport"], pkt.sport, False):
            continue
        if e.get("icmp-type") and e["icmp-type"] not in ("echo-request", "any"):
            continue
        if e.get("source") and not _addr_matches(e["source"], pkt.src, fw):
            continue
        if e.get("dest") and not _addr_matches(e["dest"], pkt.dst, fw):
            continue
        return True
    return False


def _compiles(r: dict, fw: VmFirewall, pkt: Packet) -> bool:
    for k in ("source", "dest"):
        if r.get(k):
            try:
                _addr_matches(r[k], pkt.src, fw)
            except RuleNotCompiled:
                return False
    return True


def ipfilter_refuses(fw: VmFirewall, net: str, nic: str, ip: str) -> bool:
    """The NIC's IP filter (``ruleset_create_vm_chain``, OUT: ``-m set ! --match-set
    PVEFW-<vmid>-ipfilter-<nic>-v4 src -j DROP``), compiled when ``ipfilter: 1`` or the set
    ``ipfilter-<nic>`` exists (``generate_tap_rules_direction``); ``compile_ipsets`` adds the NIC's
    MAC-derived link-local address and ``fe80::/10`` as ``nomatch``."""
    import ipaddress

    name = f"ipfilter-{nic}"
    if str(fw.options.get("ipfilter", "0")) != "1" and name not in fw.ipsets:
        return False
    try:
        addr = ipaddress.ip_address(ip.split("/", 1)[0])
    except ValueError:
        return True
    if addr.version == 6 and addr.is_link_local:
        mac = re.search(r"(?:^|,)[a-z0-9]+=([0-9A-Fa-f:]{17})(?:,|$)", net)
        return mac is None or addr != ipaddress.ip_address(mac_to_linklocal(mac.group(1)))
    allowed = False
    for e in fw.ipsets.get(name, []):
        try:
            cidr = ipaddress.ip_network(str(e["cidr"]), strict=False)
        except ValueError:
            continue  # an alias: z9 writes none
        if cidr.version == addr.version and addr in cidr:
            if e.get("nomatch"):
                return True
            allowed = True
    return not allowed


def chain_verdict(c: Compiled, vmid: int, nic: str, direction: str, pkt: Packet) -> ChainVerdict:
    """The VM's ``tap<vmid>i<n>-IN`` / ``-OUT`` chain as ``generate_tap_rules_direction`` compiles it,
    for the first packet of a new connection."""
    where = f"VM {vmid} {nic} {direction}"
    if not c.enabled:
        # compile(): `return ({}, {}, {}, {}) if !$cluster_conf->{options}->{enable};`
        return ChainVerdict(True, "datacenter firewall off (cluster.fw enable: 0): nothing is filtered")
    fw = c.vms.get(vmid)
    if fw is None:
        # compile_iptables_filter: `return if !$vmfw_conf || !$vmfw_conf->{options}->{enable};`
        return ChainVerdict(True, f"VM {vmid}: its firewall is off (enable: 0): not filtered")
    net = c.nics.get(vmid, {}).get(nic)
    if net is None or "firewall=1" not in net.split(","):
        # `next if !$net->{firewall};` — the tap is not behind a firewall bridge
        return ChainVerdict(True, f"VM {vmid} {nic}: firewall=0 on the NIC: not filtered")
    opts = fw.options
    v6 = pkt.version == 6
    # ruleset_create_vm_chain: DHCP first (unless `dhcp: 0`)
    if str(opts.get("dhcp", "1")) != "0" and pkt.proto_num == 17:
        client, server = (546, 547) if v6 else (68, 67)
        if (direction == "out" and pkt.sport == client and pkt.dport == server) or \
                (direction == "in" and pkt.sport == server and pkt.dport == client):
            return ChainVerdict(True, f"{where}: DHCP is always let through (dhcp: 1)")
    if direction == "out" and ipfilter_refuses(fw, net, nic, str(pkt.src)):
        return ChainVerdict(False, f"{where}: the IP filter drops it: {pkt.src} is not in ipfilter-{nic}")
    for i, r in enumerate(fw.rules):
        # ruleset_generate_vm_rules
        if r.get("iface") and r["iface"] != nic:
            continue
        if not r.get("enable") or r.get("errors"):
            continue
        if r.get("ipversion") and int(r["ipversion"]) != pkt.version:
            continue
        if r["type"] == "group":
            # security groups (cluster.fw [group …]) are not modelled (z9 writes none): as the
            # simulator has none, a group rule jumps to an empty chain (generate_group_rules: "no
            # such security group", an empty GROUP-<name>-IN/OUT) and decides nothing
            continue
        if r["type"] != direction or not _compiles(r, fw, pkt):
            continue
        if _rule_matches(r, pkt, fw):
            action = r["action"]
            return ChainVerdict(action == "ACCEPT", f"{where}: {_rule_text(i, r)} decided {action}",
                                action == "REJECT")
    key = f"policy_{direction}"
    # `$policy = $options->{policy_out} || 'ACCEPT'` / `$options->{policy_in} || 'DROP'`
    policy = opts.get(key) or ("ACCEPT" if direction == "out" else "DROP")
    default = "" if opts.get(key) else " (the default: not set)"
    return ChainVerdict(policy == "ACCEPT", f"{where}: no rule matched; {key} {policy}{default} decided",
                        policy == "REJECT")


# ---- the world: which guest holds an address -------------------------------------------------------
@dataclass
class Endpoint:
    vmid: int
    nic: str  # netN
    addr: Any  # the endpoint's address (ipaddress), None when not known
    node: str = ""


def _nic_of(vm_config: Mapping[str, str], mac: str | None) -> str:
    """The ``netN`` whose MAC is ``mac`` (net0 when unknown: an address on an interface that is no NIC)."""
    from .cloudinit import parse_net

    if mac:
        for k, v in vm_config.items():
            if re.fullmatch(r"net\d+", k) and parse_net(str(v)).get("macaddr", "").lower() == mac.lower():
                return k
    return "net0"


def guest_endpoints(cluster: Any, vmid: int) -> list[Endpoint]:
    """Every address the running, booted guest holds (guest-network-get-interfaces: its cloud-init
    network, addresses configured inside, keepalived's VIP), each on the NIC it belongs to."""
    import ipaddress

    vm = cluster.vms.get(vmid)
    g = cluster.guests.get(vmid)
    if vm is None or not vm.running or g is None or not (g.powered and g.booted):
        return []
    macs = {i["name"]: i.get("hardware-address") for i in g.interfaces()}
    out = []
    for i in g.interfaces():
        if i["name"] == "lo":
            continue
        mac = macs.get(i["name"])
        nic = _nic_of(vm.config, mac if mac and mac != "00:00:00:00:00:00" else None)
        for a in i.get("ip-addresses", []):
            addr = ipaddress.ip_address(a["ip-address"])
            if not addr.is_link_local:
                out.append(Endpoint(vmid, nic, addr, vm.node))
    return out


def _configured(cluster: Any, ip: Any) -> list[Endpoint]:
    """VMs whose cloud-init ``ipconfigN`` gives them ``ip`` (known even while the guest is not up)."""
    import ipaddress

    from .cloudinit import parse_ipconfig

    out = []
    for vm in cluster.vms.values():
        for k, v in vm.config.items():
            m = re.fullmatch(r"ipconfig(\d+)", k)
            if not m:
                continue
            ipc = parse_ipconfig(str(v))
            for key in ("ip", "ip6"):
                try:
                    if ipc.get(key) and "/" in ipc[key] and ipaddress.ip_interface(ipc[key]).ip == ip:
                        out.append(Endpoint(vm.vmid, f"net{m.group(1)}", ip, vm.node))
                except ValueError:
                    pass
    return out


def holders(cluster: Any, ip: Any) -> list[Endpoint]:
    """The running guests that hold ``ip`` now (two, when two VRRP masters both hold a VIP)."""
    return [e for vmid in sorted(cluster.guests.guests) for e in guest_endpoints(cluster, vmid) if e.addr == ip]


def primary(cluster: Any, vmid: int) -> Endpoint | None:
    """The guest's first address on net0 (else on its first NIC), or its ``ipconfig0`` address."""
    import ipaddress

    eps = guest_endpoints(cluster, vmid)
    for e in sorted(eps, key=lambda e: (e.nic != "net0", e.addr.version)):
        return e
    vm = cluster.vms.get(vmid)
    if vm is None:
        return None
    from .cloudinit import parse_ipconfig

    ip = parse_ipconfig(str(vm.config.get("ipconfig0", ""))).get("ip", "")
    try:
        return Endpoint(vmid, "net0", ipaddress.ip_interface(ip).ip, vm.node) if "/" in ip else None
    except ValueError:
        return None


@dataclass
class Delivery:
    delivered: bool
    reason: str
    src_vmid: int | None = None
    dst_vmid: int | None = None
    steps: list[str] = field(default_factory=list)
    rejected: bool = False  # not delivered, and the sender is told (REJECT) rather than left waiting (DROP)

    def to_json(self) -> dict:
        return {"delivered": self.delivered, "reason": self.reason, "src_vmid": self.src_vmid,
                "dst_vmid": self.dst_vmid, "steps": list(self.steps), "rejected": self.rejected}


def _through(c: Compiled, sender: Endpoint | None, receiver: Endpoint, pkt: Packet) -> Delivery:
    """The first packet of a new connection: the sender's OUT chain (a guest), the receiver's IN chain."""
    steps: list[str] = []
    if sender is not None:
        if sender.vmid == receiver.vmid:
            return Delivery(True, f"VM {sender.vmid} talks to itself: it never leaves the guest",
                            sender.vmid, receiver.vmid)
        out = chain_verdict(c, sender.vmid, sender.nic, "out", pkt)
        steps.append(out.reason)
        if not out.accepted:
            return Delivery(False, out.reason, sender.vmid, receiver.vmid, steps, out.rejected)
    inn = chain_verdict(c, receiver.vmid, receiver.nic, "in", pkt)
    steps.append(inn.reason)
    return Delivery(inn.accepted, inn.reason, sender.vmid if sender else None, receiver.vmid, steps,
                    inn.rejected)


def deliver(cluster: Any, src: str, dst: str, proto: str = "tcp", port: int | None = None,
            sport: int | None = None) -> Delivery:
    """**Would a packet from ``src`` to ``dst`` be delivered** (the first packet of a new connection,
    by what pve-firewall last compiled)? ``src``: an address (a guest's, or any other: "outside") or
    a vmid; ``dst``: a guest by vmid or by an address it holds; ``proto``: a name or number of
    /etc/protocols (``tcp``, ``udp``, ``icmp`` — an echo-request —, ``vrrp``/112, ``ah``/51 …);
    ``port``: the destination port (tcp/udp/…). Raises ValueError for a malformed question."""
    import ipaddress

    if proto_number(proto) is None:
        raise ValueError(f"proto: unknown protocol '{proto}' (a name or number of /etc/protocols)")
    if port is not None and not 0 < int(port) < 65536:
        raise ValueError("port: 1-65535")
    for name, v in (("src", src), ("dst", dst)):
        if not re.fullmatch(r"\d+", str(v)):
            try:
                ipaddress.ip_address(str(v))
            except ValueError:
                raise ValueError(f"{name}: a vmid or an IP address, not {v!r}") from None
    c = cluster.firewall.compiled()
    # the receiver(s)
    if re.fullmatch(r"\d+", str(dst)):
        vmid = int(dst)
        vm = cluster.vms.get(vmid)
        if vm is None:
            return Delivery(False, f"no VM {vmid}", None, vmid)
        ep = primary(cluster, vmid)
        if not vm.running or not guest_endpoints(cluster, vmid):
            return Delivery(False, f"VM {vmid} is not running (or its guest is not up)", None, vmid)
        receivers = [ep or Endpoint(vmid, "net0", None, vm.node)]
    else:
        try:
            dip = ipaddress.ip_address(str(dst))
        except ValueError:
            raise ValueError(f"dst: a vmid or an IP address, not {dst!r}") from None
        receivers = holders(cluster, dip)
        if not receivers:
            known = _configured(cluster, dip)
            if known:
                return Delivery(False, f"VM {known[0].vmid} has {dip} configured but is not running "
                                       "(or its guest is not up)", None, known[0].vmid)
            return Delivery(False, f"no running guest holds {dip}")
    # the sender
    sender: Endpoint | None
    if re.fullmatch(r"\d+", str(src)):
        sender = primary(cluster, int(src))
        if sender is None or not guest_endpoints(cluster, int(src)):
            return Delivery(False, f"VM {src} is not running (or has no address)", int(src))
    else:
        try:
            sip = ipaddress.ip_address(str(src))
        except ValueError:
            raise ValueError(f"src: an IP address or a vmid, not {src!r}") from None
        held = holders(cluster, sip)
        sender = held[0] if held else None
        if sender is None:
            sender_addr = sip
        else:
            sender_addr = sender.addr
    src_addr = sender.addr if sender is not None else sender_addr
    src_vmid = int(src) if re.fullmatch(r"\d+", str(src)) else None
    results = []
    for r in receivers:
        # layer 2 first: the two ends must share a bridge (vmbr0, or an SDN VNet both NICs are on)
        seg, how = _segment(cluster, r), None
        if sender is not None:
            via = _on_segment(cluster, sender, seg, src_vmid)
            if via is None:
                results.append(Delivery(False, f"VM {sender.vmid} has no NIC on {seg}, where VM {r.vmid} holds "
                                               f"{r.addr} ({r.nic}): no path between them", sender.vmid, r.vmid))
                continue
            sender_here: Endpoint | None = via
        else:
            sender_here = None
            if seg != PUBLIC_BRIDGE:
                results.append(Delivery(False, f"{src_addr} is outside; VM {r.vmid}'s {r.nic} is on VNet {seg}, a "
                                               "private network: not reachable from outside", None, r.vmid))
                continue
        how = _segment_up(cluster, seg, [e for e in (sender_here, r) if e is not None])
        if how is not None:
            results.append(Delivery(False, how, sender_here.vmid if sender_here else None, r.vmid))
            continue
        s_addr = sender_here.addr if sender_here is not None else src_addr
        dst_addr = r.addr if r.addr is not None else None
        if dst_addr is not None and s_addr.version != dst_addr.version:
            raise ValueError("src and dst are of different IP versions")
        pkt = Packet(s_addr, dst_addr, str(proto), int(port) if port is not None else None,
                     int(sport) if sport is not None else None)
        d = _through(c, sender_here, r, pkt)
        if sender is None:
            d.steps.insert(0, f"{src_addr} is outside (no guest holds it): no OUT chain")
        results.append(d)
        if d.delivered:
            return d
    return results[0]


PUBLIC_BRIDGE = "vmbr0"  # every node's bridge to the outside (Cluster.bridges); SDN VNets are private


def _segment(cluster: Any, ep: Endpoint) -> str:
    """The bridge an endpoint's NIC is plugged into (``bridge=`` of its ``netN``; vmbr0 otherwise)."""
    vm = cluster.vms.get(ep.vmid)
    m = re.search(r"(?:^|,)bridge=([^,]+)", str((vm.config if vm else {}).get(ep.nic, "")))
    return m.group(1) if m else PUBLIC_BRIDGE


def _on_segment(cluster: Any, sender: Endpoint, seg: str, vmid: int | None) -> Endpoint | None:
    """The sender's endpoint on bridge ``seg``: the address it sends from there (a guest on two
    networks sends from the NIC on the receiver's one), None when it has no NIC there."""
    if _segment(cluster, sender) == seg:
        return sender
    if vmid is None:  # an address held by a guest: it sends from that NIC only
        return None
    eps = [e for e in guest_endpoints(cluster, vmid) if _segment(cluster, e) == seg]
    return min(eps, key=lambda e: e.addr.version) if eps else None


def _segment_up(cluster: Any, seg: str, ends: list[Endpoint]) -> str | None:
    """Why a VNet cannot carry the packet (None: it can): each end's node must have brought the VNet
    up (its last SDN reload held it: pve-network ``SDN.pm`` generate_etc_network_config per node)."""
    if seg == PUBLIC_BRIDGE or getattr(cluster, "sdn", None) is None:
        return None
    for e in ends:
        if seg not in cluster.sdn.bridges(e.node):
            return f"VNet {seg} is not up on node {e.node} (its SDN config was not applied and reloaded there)"
    return None


def exchange(cluster: Any, a: Endpoint, b: Endpoint, proto: str) -> tuple[bool, bool, str]:
    """Two guests that keep sending to each other (keepalived's unicast VRRP adverts: ``a`` to ``b``
    and ``b`` to ``a``, same addresses, same protocol): (does ``a`` hear ``b``, does ``b`` hear ``a``,
    why).

    Conntrack decides, not the IN chains: with ``bridge-nf-call-iptables`` (``enable_bridge_firewall``)
    every bridge hop runs the host's conntrack, and PVEFW-FORWARD accepts ``RELATED,ESTABLISHED``
    before any tap chain (``ruleset_chain_add_conn_filters``). A packet that passes its sender's OUT
    chain is confirmed as a flow at that bridge hop (and again at the next host's vmbr0 hop, before
    the receiver's IN chain); the peer's packets in the other direction are that flow's replies —
    ESTABLISHED, past the peer's OUT and the sender's IN chains — and from then on both directions
    are ESTABLISHED (a protocol without ports is tracked by addresses and protocol:
    ``nf_conntrack_proto_generic``; "UDP hole punching" works the same way). So both hear each other
    when **either** OUT chain lets its adverts out (an IN chain dropping them only delays it one
    advert), and neither does when both OUT chains drop them."""
    c = cluster.firewall.compiled()
    out_a = chain_verdict(c, a.vmid, a.nic, "out", Packet(a.addr, b.addr, proto))
    out_b = chain_verdict(c, b.vmid, b.nic, "out", Packet(b.addr, a.addr, proto))
    ok = out_a.accepted or out_b.accepted
    why = "; ".join(v.reason for v in (out_a, out_b))
    return ok, ok, why


# ---- for the guest models (appliance, keepalived, kubeadm) ------------------------------------------
def nic_holding(cluster: Any, vmid: int, ip: str) -> Endpoint | None:
    """The endpoint of ``ip`` on VM ``vmid`` from its applied network config (cloud-init), without
    asking the guest's interfaces (which the keepalived model itself provides: no recursion). An
    address configured otherwise (a VIP) is on ``net0``. None: not a valid address or no such VM."""
    import ipaddress

    vm = cluster.vms.get(vmid)
    try:
        addr = ipaddress.ip_address(str(ip).split("/", 1)[0])
    except ValueError:
        return None
    if vm is None:
        return None
    g = cluster.guests.guests.get(vmid)
    for n in (g.net_applied if g is not None else []):
        if any(ipaddress.ip_interface(a).ip == addr for a in n.get("addresses") or []):
            return Endpoint(vmid, _nic_of(vm.config, n.get("mac")), addr, vm.node)
    return Endpoint(vmid, "net0", addr, vm.node)


def dropped(cluster: Any, src_vmid: int, src_ip: str, dst_vmid: int, dst_ip: str, proto: str,
            port: int | None = None) -> Delivery | None:
    """The firewall's verdict on the first packet of a connection a guest model opens (``src_vmid``
    sending from ``src_ip`` to ``dst_ip`` held by ``dst_vmid``): the :class:`Delivery` when a chain
    drops or rejects it, None when it passes (or an end is unknown: not the firewall's business)."""
    a, b = nic_holding(cluster, src_vmid, src_ip), nic_holding(cluster, dst_vmid, dst_ip)
    if a is None or b is None or a.addr.version != b.addr.version:
        return None
    c = cluster.firewall.compiled()
    d = _through(c, a, b, Packet(a.addr, b.addr, proto, port))
    return None if d.delivered else d
