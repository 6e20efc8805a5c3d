"""The PVE firewall configuration the API exposes: VM firewall options and IP sets, cluster options.

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
import re
from dataclasses import dataclass, field

from .errors import PveError, param_error

VM_OPTIONS = ("dhcp", "enable", "ipfilter", "log_level_in", "log_level_out", "macfilter", "ndp", "policy_in",
              "policy_out", "radv")
CLUSTER_OPTIONS = ("ebtables", "enable", "log_ratelimit", "policy_forward", "policy_in", "policy_out")
INT_OPTIONS = {"dhcp", "enable", "ipfilter", "macfilter", "ndp", "radv", "ebtables"}
ALIAS_RE = re.compile(r"(?:dc/|guest/)?[A-Za-z][A-Za-z0-9\-_]+")
MODIFIED = "detected modified configuration - file changed by other user? Try again."


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

    def to_json(self) -> dict:
        return {"options": dict(self.options), "ipsets": copy.deepcopy(self.ipsets), "comments": dict(self.comments)}

    @classmethod
    def from_json(cls, d: dict) -> "VmFirewall":
        return cls(dict(d.get("options") or {}), copy.deepcopy(d.get("ipsets") or {}), dict(d.get("comments") or {}))


class Firewall:
    """Cluster-wide firewall state (VM files by vmid + cluster options)."""

    def __init__(self) -> None:
        self.vms: dict[int, VmFirewall] = {}
        self.cluster_options: dict[str, str] = {}

    # ---- lifecycle hooks (clone / destroy / reset / persistence) ----------------------------------
    def clone(self, src: int, dst: int) -> None:
        """``clone_vmfw_conf``: the target gets a copy of the source's file (or none)."""
        if src in self.vms:
            self.vms[dst] = VmFirewall.from_json(self.vms[src].to_json())
        else:
            self.vms.pop(dst, None)

    def remove(self, vmid: int) -> None:
        self.vms.pop(vmid, None)

    def clear(self) -> None:
        self.vms.clear()
        self.cluster_options.clear()

    def dump(self) -> dict:
        return {"vms": {str(k): v.to_json() for k, v in sorted(self.vms.items())},
                "cluster_options": dict(self.cluster_options)}

    def load(self, d: dict) -> None:
        self.vms = {int(k): VmFirewall.from_json(v) for k, v in (d.get("vms") or {}).items()}
        self.cluster_options = dict(d.get("cluster_options") or {})

    def vm(self, vmid: int) -> VmFirewall:
        """The VM's firewall file as ``load_vmfw_conf`` reads it (empty when absent; not created)."""
        return self.vms.get(vmid) or VmFirewall()

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
        excludes (ipset semantics)."""
        import ipaddress

        if str(self.cluster_options.get("enable", "0")) != "1":
            return False
        fw = self.vm(vmid)
        name = f"ipfilter-{nic}"
        if str(fw.options.get("enable", "0")) != "1":
            return False
        if str(fw.options.get("ipfilter", "0")) != "1" and name not in fw.ipsets:
            return False
        net = str(vm_config.get(nic, ""))
        if "firewall=1" not in net.split(","):
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

    # ---- options ---------------------------------------------------------------------------------
    def get_vm_options(self, vmid: int) -> dict:
        out, _ = object_digest(self.vm(vmid).options)
        return _typed({k: v for k, v in out.items() if k != "digest"}) | {"digest": out["digest"]}

    def set_vm_options(self, vmid: int, params: dict[str, str]) -> None:
        fw = self.vm(vmid)
        _, digest = object_digest(fw.options)
        assert_if_modified(digest, params.get("digest"))
        self._set_options(fw.options, VM_OPTIONS, params)
        self._save(vmid, fw)

    def get_cluster_options(self) -> dict:
        out, _ = object_digest(self.cluster_options)
        return _typed({k: v for k, v in out.items() if k != "digest"}) | {"digest": out["digest"]}

    def set_cluster_options(self, params: dict[str, str]) -> None:
        _, digest = object_digest(self.cluster_options)
        assert_if_modified(digest, params.get("digest"))
        self._set_options(self.cluster_options, CLUSTER_OPTIONS, params)

    @staticmethod
    def _set_options(options: dict[str, str], known: tuple[str, ...], params: dict[str, str]) -> None:
        from .schema import split_list

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
        fw, entries = self._ipset(vmid, name)
        if entries and not force:
            raise PveError(500, f"IPSet '{name}' is not empty")
        del fw.ipsets[name]
        fw.comments.pop(name, None)
        self._save(vmid, fw)

    def add_ip(self, vmid: int, name: str, params: dict[str, str]) -> None:
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
        fw, entries = self._ipset(vmid, name)
        assert_if_modified(list_digest(entries)[1], params.get("digest"))
        fw.ipsets[name] = [e for e in entries if e["cidr"] != cidr]
        self._save(vmid, fw)
