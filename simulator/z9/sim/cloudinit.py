"""PVE's own cloud-init drive: what qemu-server generates from a VM's config, and when.

Source: qemu-server ``src/PVE/QemuServer/Cloudinit.pm`` (``cloudinit_userdata``, ``nocloud_network``,
``nocloud_gen_metadata``, ``dump_cloudinit_config``) and ``src/PVE/API2/Qemu.pm`` (``cloudinit_pending``,
``cloudinit_update``).

When it takes effect (research §1.2): the cloud-init keys (:data:`CI_KEYS`: ``ipconfigN``,
``nameserver``, ``searchdomain``, ``sshkeys``, ``ciuser``, ``cipassword``, ``citype``, ``ciupgrade``,
``cicustom``) are written to the config at once, but the drive is **regenerated** only at a start
(also the start half of ``status/reboot``) or by ``PUT …/cloudinit``. Each VM keeps
``ci_applied``: the keys as of the last regeneration (PVE keeps the same information as the
``[special:cloudinit]`` section), which ``GET …/cloudinit`` compares with the config:
``{key, value}`` unchanged, ``{key, value, pending}`` changed, ``{key, pending}`` added,
``{key, delete: 1}`` removed (``cipassword`` shown as ``**********``).

The drive exists only if a disk of the VM is ``<storage>:vm-<vmid>-cloudinit`` (the template's
``ide2``). Its files (NoCloud, label ``cidata``): ``user-data``, ``network-config`` (v1),
``meta-data`` = ``instance-id: sha1(user-data . network-config)``, ``vendor-data`` (empty). Any
change of a key therefore changes the instance-id, and a guest that boots from the new drive is a new
instance (see :mod:`z9.sim.guest`). ``nameserver``/``searchdomain`` unset → the node's resolv.conf
(:data:`HOST_DNS`). ``citype`` other than ``nocloud`` is not modelled (treated as nocloud). ``cicustom``
needs snippets volumes, which the API cannot write: a VM with it fails to start, regenerate or dump its
drive (:func:`check_cicustom`).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import urllib.parse

CI_OPTIONS = ("cicustom", "cipassword", "citype", "ciupgrade", "ciuser", "nameserver", "searchdomain", "sshkeys")
IPCONFIG_RE = re.compile(r"ipconfig(\d+)")
CLOUDINIT_VOL_RE = re.compile(r"vm-(\d+)-cloudinit")

# the nodes' /etc/resolv.conf (get_dns_conf falls back to it)
HOST_DNS = {"search": "pve.sim", "nameservers": ["192.0.2.53"]}


def is_ci_key(key: str) -> bool:
    m = IPCONFIG_RE.fullmatch(key)
    return key in CI_OPTIONS or (m is not None and int(m.group(1)) < 32)


def ci_values(conf: dict[str, str]) -> dict[str, str]:
    """The cloud-init keys of a config (what ``[special:cloudinit]`` tracks)."""
    return {k: v for k, v in conf.items() if is_ci_key(k)}


def cloudinit_drive(conf: dict[str, str], vmid: int) -> str | None:
    """The config key of the VM's cloud-init drive (``ide2``...), or None."""
    for k, v in sorted(conf.items()):
        if re.fullmatch(r"(ide|scsi|sata|virtio)\d+", k):
            volid = v.split(",", 1)[0]
            m = CLOUDINIT_VOL_RE.search(volid)
            if m and int(m.group(1)) == vmid:
                return k
    return None


def parse_ipconfig(text: str) -> dict[str, str]:
    """``ip=<cidr|dhcp>,gw=..,ip6=<cidr|dhcp|auto>,gw6=..``; neither ip nor ip6 → ``ip=dhcp``."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if "=" in part:
            k, _, v = part.partition("=")
            out[k.strip()] = v.strip()
    if not out.get("ip") and not out.get("ip6"):
        out["ip"] = "dhcp"
    return out


def parse_net(text: str) -> dict[str, str]:
    """``virtio=<MAC>,bridge=..`` → ``{model, macaddr, bridge, ...}``."""
    out: dict[str, str] = {}
    for i, part in enumerate((text or "").split(",")):
        k, sep, v = part.partition("=")
        if i == 0 and re.fullmatch(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}", v):
            out["model"], out["macaddr"] = k, v
        elif sep:
            out[k] = v
    return out


def hostname_fqdn(conf: dict[str, str], vmid: int) -> tuple[str, str]:
    hostname = conf.get("name") or f"VM{vmid}"
    if "." in hostname:
        return hostname.split(".", 1)[0], hostname
    if conf.get("searchdomain"):
        return hostname, f"{hostname}.{conf['searchdomain']}"
    return hostname, hostname


def dns_conf(conf: dict[str, str]) -> tuple[list[str], list[str]]:
    search = (conf.get("searchdomain") if conf.get("searchdomain") is not None else HOST_DNS["search"]).split()
    ns = conf.get("nameserver")
    return search, (ns.split() if ns is not None else list(HOST_DNS["nameservers"]))


def userdata(conf: dict[str, str], vmid: int) -> str:
    hostname, fqdn = hostname_fqdn(conf, vmid)
    out = f"#cloud-config\nhostname: {hostname}\nmanage_etc_hosts: true\nfqdn: {fqdn}\n"
    user, password = conf.get("ciuser"), conf.get("cipassword")
    if user is not None:
        out += f"user: {user}\n"
        if user == "root":
            out += "disable_root: False\n"
    if password is not None:
        out += f"password: {password}\n"
    if conf.get("sshkeys") is not None:
        keys = [k.rstrip("\n") for k in urllib.parse.unquote(conf["sshkeys"]).split("\n")]
        out += "ssh_authorized_keys:\n" + "".join(f"  - {k}\n" for k in keys if k.strip())
    out += "chpasswd:\n  expire: False\n"
    if user is None or user != "root":
        out += "users:\n  - default\n"
    if conf.get("ciupgrade") is None or conf.get("ciupgrade") not in ("0", ""):
        out += "package_upgrade: true\n"
    return out


def _netmask(prefix: str) -> str:
    return str(ipaddress.IPv4Network(f"0.0.0.0/{int(prefix)}").netmask)


def network(conf: dict[str, str]) -> str:
    """``nocloud_network``: network-config version 1 (interfaces sorted as strings, as Perl ``sort``)."""
    out = "version: 1\nconfig:\n"
    i = "    "
    for iface in sorted(k for k in conf if re.fullmatch(r"net\d+", k)):
        n = iface[3:]
        if not conf.get(f"ipconfig{n}"):
            continue
        net = parse_net(conf[iface])
        ipc = parse_ipconfig(conf[f"ipconfig{n}"])
        mac = net.get("macaddr", "").lower()
        out += f"{i}- type: physical\n{i}  name: eth{n}\n{i}  mac_address: '{mac}'\n{i}  subnets:\n"
        j = i + "  "
        ip = ipc.get("ip")
        if ip is not None:
            if ip == "dhcp":
                out += f"{j}- type: dhcp4\n"
            else:
                addr, _, prefix = ip.partition("/")
                out += f"{j}- type: static\n{j}  address: '{addr}'\n{j}  netmask: '{_netmask(prefix or '32')}'\n"
                if ipc.get("gw") is not None:
                    out += f"{j}  gateway: '{ipc['gw']}'\n"
        ip6 = ipc.get("ip6")
        if ip6 is not None:
            if ip6 == "dhcp":
                out += f"{j}- type: dhcp6\n"
            elif ip6 == "auto":
                out += f"{j}- type: ipv6_slaac\n"
            else:
                out += f"{j}- type: static6\n{j}  address: '{ip6}'\n"
                if ipc.get("gw6") is not None:
                    out += f"{j}  gateway: '{ipc['gw6']}'\n"
    search, ns = dns_conf(conf)
    out += f"{i}- type: nameserver\n"
    if ns:
        out += f"{i}  address:\n" + "".join(f"{i}  - '{a}'\n" for a in ns)
    if search:
        out += f"{i}  search:\n" + "".join(f"{i}  - '{s}'\n" for s in search)
    return out


def metadata(user: str, net: str) -> str:
    """``nocloud_gen_metadata``: ``instance-id: <sha1(user-data . network-config)>``."""
    return f"instance-id: {hashlib.sha1((user + net).encode()).hexdigest()}\n"


def validate_ssh_public_keys(sshkeys: str | None) -> None:
    """pve-common ``PVE::Tools::validate_ssh_public_keys``, which qemu-server ``PVE/API2/Qemu.pm`` runs on
    ``uri_unescape($param->{sshkeys})`` in create_vm and update_vm (PUT and POST config) before anything
    else: every non-blank line is written to a file and ``ssh-keygen -l -f`` must read it, else the
    request dies ``SSH public key validation error`` (HTTP 500). The real ssh-keygen runs here when it
    is installed; without it the key is read as ssh-keygen reads it (``z9.common.sshkeys``)."""
    if sshkeys is None:
        return
    import shutil
    import subprocess
    import tempfile

    from .errors import PveError

    keygen = shutil.which("ssh-keygen")
    for line in urllib.parse.unquote(sshkeys).split("\n"):
        if not line.strip():
            continue
        if keygen:
            with tempfile.NamedTemporaryFile("w", suffix=".pub") as f:
                f.write(line)
                f.flush()
                ok = subprocess.run([keygen, "-l", "-f", f.name], capture_output=True, timeout=10).returncode == 0
        else:
            from z9.common.sshkeys import unreadable

            ok = unreadable(line.strip()) is None
        if not ok:
            raise PveError(500, "SSH public key validation error")


def check_cicustom(conf: dict[str, str]) -> None:
    """``cicustom`` files are read from **snippets** volumes (``read_cloudinit_snippets_file``), which the
    API cannot write (``upload`` takes iso/vztmpl/import only): a volume of another type fails
    ``<volid> is not in the snippets directory``, a snippet fails ``can't open '<path>' - No such file or
    directory`` (pve-common ``file_get_contents``). So a VM with ``cicustom`` cannot start here, nor can
    its drive be regenerated or dumped — as on a PVE whose snippets nobody copied in over SSH."""
    from .errors import PveError
    from .storage import STORAGES

    for part in (conf.get("cicustom") or "").split(","):
        kind, sep, volid = part.partition("=")
        if not sep or kind not in ("user", "network", "meta", "vendor") or not volid:
            continue
        sid, colon, volname = volid.partition(":")
        sdef = next((d for d in STORAGES if d.id == sid), None)
        if not colon or sdef is None:
            raise PveError(500, f"storage '{sid}' does not exist" if colon else f"unable to parse volume ID '{volid}'")
        m = re.fullmatch(r"snippets/([^/]+)", volname)
        if m is None or sdef.path is None:
            raise PveError(500, f"{volid} is not in the snippets directory")
        raise PveError(500, f"can't open '{sdef.path}/snippets/{m.group(1)}' - No such file or directory")


def dump(conf: dict[str, str], vmid: int, kind: str) -> str:
    """``GET …/cloudinit/dump?type=user|network|meta`` (generated from the current config)."""
    check_cicustom(conf)
    user = userdata(conf, vmid)
    if kind == "user":
        return user
    net = network(conf)
    if kind == "network":
        return net
    return metadata(user, net)


def generate(conf: dict[str, str], vmid: int) -> dict[str, bytes] | None:
    """The files of the regenerated drive (``/user-data``...) or None without a cloud-init drive."""
    if cloudinit_drive(conf, vmid) is None:
        return None
    check_cicustom(conf)
    user, net = userdata(conf, vmid), network(conf)
    return {"user-data": user.encode(), "network-config": net.encode(), "meta-data": metadata(user, net).encode(),
            "vendor-data": b""}


def pending(conf: dict[str, str], applied: dict[str, str]) -> list[dict]:
    """``GET …/cloudinit``: the config's cloud-init keys against those of the last regeneration."""
    mask = "**********"
    cur = ci_values(conf)
    rows: list[dict] = []
    for key in sorted(set(cur) | set(applied)):
        new, old = cur.get(key), applied.get(key)
        if key == "cipassword":
            new = mask if new is not None else None
            old = mask if old is not None else None
        if new is not None and key not in applied:
            rows.append({"key": key, "pending": new})
        elif new is None:
            rows.append({"key": key, "delete": 1})
        elif cur[key] != applied[key]:
            rows.append({"key": key, "value": old, "pending": new})
        elif cur[key] not in ("", "0"):  # PVE: "next if !$conf->{$opt}"
            rows.append({"key": key, "value": new})
    return rows
