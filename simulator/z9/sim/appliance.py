"""The load balancer appliance model on the guest model (:mod:`z9.sim.guest` command handlers).

Configurations are judged by the **real tools**, Debian's ``haproxy`` and ``keepalived`` installed on
the simulator's host (not an imitation of their grammar); everything else follows from the files z9
wrote into the guest and the simulated world:

- ``haproxy -c [-q] -f FILE`` and ``keepalived -t -f FILE`` in the guest run the real binary on a copy
  of the guest's file (in a temporary directory) and answer with its exit code, stdout and stderr (the
  temporary path replaced by the guest's). keepalived checks the interfaces a file names against the
  host it runs on, so it runs in a network namespace of its own (``unshare -rn``: a user and network
  namespace, no privilege needed) holding the guest's interfaces as the guest reports them — names and
  addresses — on veth devices: a file naming ``eth0`` is refused on an appliance whose NIC is ``ens18``,
  as on a real one. Verdicts are cached by (tool, arguments, file bytes, interfaces): same input, same
  answer, so a 200-target configure runs each check once. A check the agent runs (``agent/exec``)
  whose verdict is not cached runs in the simulator's thread pool, as its cloud-init schema check
  does: the process runs (``exec-status`` ``exited: 0``) until the tool has answered, and the event
  loop serves every other request meanwhile (``haproxy -c`` takes about 140 ms). A missing binary answers 127 (``not found``)
  and says what to install on the simulator's host.
- ``systemctl reload haproxy`` (or ``restart``/``start``) checks ``/etc/haproxy/haproxy.cfg`` with
  ``haproxy -c -q`` first — Debian's ``haproxy.service`` ``ExecReload`` (haproxy 2.6
  ``admin/systemd/haproxy.service.in``) — and activates it (a rejected file leaves the running one);
  ``systemctl reload keepalived`` activates ``/etc/keepalived/keepalived.conf`` if ``keepalived -t``
  accepts it (an approximation: Debian's unit reloads with ``kill -HUP``; z9 runs ``-t`` itself first).
- ``socat stdio /run/haproxy/admin.sock`` with ``show stat`` on stdin: the CSV of the *active*
  config, each backend server computed from the world: ``UP``/``L4OK`` (``L7OK`` for an
  ``option httpchk`` backend whose answer matches ``http-check expect``) only if a VM exists that
  is running, whose guest holds the server's address — and whose IP filter does not drop what it
  sends from it (a guest taking an address it was not given; :meth:`Firewall.refuses_source`) —
  and listens on the check port
  (``POST /_sim/guests/{vmid}/listen {port, http_status?}``); no VM holding the address →
  ``DOWN``/``L4TOUT``; held but not listening → ``DOWN``/``L4CON``; wrong HTTP status →
  ``DOWN``/``L7STS``.
- keepalived (the *active* file of each running appliance): a ``static_ipaddress`` is on its
  interface whenever the appliance runs. A ``vrrp_instance``: two appliances are one VRRP domain when
  they agree on ``virtual_router_id`` and ``authentication`` (type and the first 8 characters of
  ``auth_pass``, what keepalived compares) and each lists the other's ``unicast_src_ip`` in its
  ``unicast_peer`` (adverts of a peer with another key are dropped: ``IPSEC-AH : invalid IPSEC
  HMAC-MD5 value``, both sides become MASTER — seen with the real daemons in two namespaces). In a
  domain the VIP is held by exactly one: the current holder while it runs if it has ``nopreempt``
  (keepalived.conf(5): a returning higher priority does not take it back), else the running one
  with the highest ``priority`` (lowest vmid on a tie; ``preempt_delay`` is not modelled). The VIP
  shows on the ``dev`` its block names in the holder's ``network-get-interfaces`` (and ``ip addr``).
- **The appliance image** (a template whose guest disk state carries the model
  ``{"appliance": {"nic_names": "predictable"}}``, given with ``POST /_sim/vms`` ``guest``; its clones
  inherit it with the disk): its NICs keep the kernel's predictable names, ``netN`` → ``ens<18+N>``
  (qemu-server ``PVE/QemuServer/PCI.pm`` puts ``net0`` at PCI slot 18 — ``ens18`` on a Proxmox virtio
  guest) instead of the ``eth0`` that PVE's cloud-init network config (``name: eth0``) gives an
  ordinary guest. z9 must therefore read the interface from the guest.
- A fault for tests (``POST /_sim/appliance-faults {contains, inject?}``): the next check or reload
  of a file containing ``contains`` finds ``inject`` appended to it on the guest's disk (a corrupted
  push; default: a line no tool knows), and the real tool judges the result.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections import OrderedDict
from typing import Any, Callable

from .guest import INTERFACE_PROVIDERS, ExecContext, ExecResult, Guest, Guests, command

STAT_COLUMNS = ("pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,"
                "status,weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,"
                "type,rate,rate_lim,rate_max,check_status,check_code,check_duration").split(",")
HAPROXY_CFG = "/etc/haproxy/haproxy.cfg"
KEEPALIVED_CFG = "/etc/keepalived/keepalived.conf"
DEFAULT_INJECT = "z9-sim-corrupted-line on\n"
TOOL_TIMEOUT_S = 30.0


def faults(guests: Guests) -> list[dict[str, str]]:
    return guests.__dict__.setdefault("_appliance_faults", [])


# ---------------------------------------------------------------- the real tools

def tool_path(name: str) -> str | None:
    """The host's binary (``PATH``, else ``/usr/sbin``: Debian installs both there)."""
    found = shutil.which(name)
    if found:
        return found
    p = f"/usr/sbin/{name}"
    return p if os.access(p, os.X_OK) else None


def tools_missing() -> list[str]:
    """The real tools (and what runs keepalived in a namespace) the simulator's host lacks."""
    return [t for t in ("haproxy", "keepalived", "unshare", "ip") if tool_path(t) is None]


_CACHE: "OrderedDict[tuple, tuple[int, str, str]]" = OrderedDict()
_CACHE_MAX = 512
_CACHE_LOCK = threading.Lock()


def _missing(name: str) -> tuple[int, str, str]:
    return 127, "", (f"/bin/sh: 1: {name}: not found (the simulator runs the real {name}: install Debian's "
                     f"package on the simulator's host)\n")


def _netns_script(ifaces: list[tuple[str, list[str]]]) -> str:
    """A shell prologue that gives a fresh network namespace the guest's interfaces (veth devices,
    the guest's names and addresses, up)."""
    lines = ["set -e", "ip link set lo up"]
    for i, (name, addrs) in enumerate(ifaces):
        lines.append(f"ip link add {shlex.quote(name)} type veth peer name z9peer{i}")
        for a in addrs:
            lines.append(f"ip addr add {shlex.quote(a)} dev {shlex.quote(name)}")
        lines.append(f"ip link set {shlex.quote(name)} up")
    lines.append("set +e")
    return "\n".join(lines) + "\n"


def _key(name: str, args: list[str], data: bytes, ifaces: list[tuple[str, list[str]]] | None) -> tuple:
    return (name, tuple(args), hashlib.sha256(data).hexdigest(), tuple((n, tuple(a)) for n, a in ifaces or ()))


def cached(name: str, args: list[str], data: bytes, ifaces: list[tuple[str, list[str]]] | None = None) -> bool:
    """Whether :func:`run_tool` has this verdict already (it answers without running the tool)."""
    with _CACHE_LOCK:
        return _key(name, args, data, ifaces) in _CACHE


def run_tool(name: str, args: list[str], guest_path: str, data: bytes,
             ifaces: list[tuple[str, list[str]]] | None = None) -> tuple[int, str, str]:
    """Run the real ``name`` with ``args`` (``{file}`` standing for the guest's file) on a copy of
    ``data``; keepalived in a namespace with ``ifaces``. ``(exitcode, stdout, stderr)``, cached."""
    key = _key(name, args, data, ifaces)
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
    if hit is not None:
        return hit[0], hit[1].replace("\0", guest_path), hit[2].replace("\0", guest_path)
    binary = tool_path(name)
    if binary is None:
        return _missing(name)
    with tempfile.TemporaryDirectory(prefix=f"z9-sim-{name}-") as tmp:
        path = os.path.join(tmp, os.path.basename(guest_path) or "file")
        with open(path, "wb") as f:
            f.write(data)
        argv = [binary, *(path if a == "{file}" else a for a in args)]
        if ifaces is not None:
            unshare, ip = tool_path("unshare"), tool_path("ip")
            if unshare is None or ip is None:
                return _missing("unshare" if unshare is None else "ip")
            script = _netns_script(ifaces) + 'exec "$@"\n'
            argv = [unshare, _UNSHARE[0], "sh", "-c", script, "sh", *argv]
        code, out, err = _run(argv, tmp, name)
        if ifaces is not None and code != 0 and "unshare failed" in err and _UNSHARE[0] == "-rn" \
                and os.geteuid() == 0:
            # no unprivileged user namespaces here: as root, a network namespace alone does
            _UNSHARE[0] = "-n"
            argv[1] = "-n"
            code, out, err = _run(argv, tmp, name)
        # the answer names the guest's file, not the copy (and the copy's base name alone, as
        # keepalived prints it, is the guest's base name already)
        out, err = out.replace(path, "\0"), err.replace(path, "\0")
    if "unshare failed" not in err:  # a verdict of the tool, not of this host's namespaces
        with _CACHE_LOCK:
            _CACHE[key] = (code, out, err)
            if len(_CACHE) > _CACHE_MAX:
                _CACHE.popitem(last=False)
    return code, out.replace("\0", guest_path), err.replace("\0", guest_path)


_UNSHARE = ["-rn"]  # a user + network namespace (no privilege needed); "-n" once that proved impossible as root


def _run(argv: list[str], cwd: str, name: str) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, cwd=cwd, capture_output=True, timeout=TOOL_TIMEOUT_S,
                           env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LANG": "C"})
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        return 124, "", f"{name}: no answer within {TOOL_TIMEOUT_S:.0f}s\n"


def guest_ifaces(g: Guest) -> list[tuple[str, list[str]]]:
    """The guest's interfaces as it reports them (names, addresses without IPv6 link-local; not lo)."""
    predictable_names(g)
    out = []
    for n in g.net_applied:
        addrs = list(n["addresses"]) + [a for a in g.extra.get(n["name"], []) if a not in n["addresses"]]
        out.append((n["name"], addrs))
    return out


def _with_fault(g: Guest, path: str, data: bytes) -> bytes:
    """A fault's ``inject`` appended to the guest's file (once) when it contains ``contains``."""
    for f in faults(g.guests):
        inject = (f.get("inject") or DEFAULT_INJECT).encode()
        if f["contains"].encode() in data and not data.endswith(inject):
            data = data + (b"" if data.endswith(b"\n") else b"\n") + inject
            g.write_file(path, data)
    return data


ToolRun = Callable[[], "tuple[int, str, str]"]


def haproxy_check(g: Guest, path: str, quiet: bool = False) -> tuple[int, str, str]:
    return _prepared(haproxy_check_run(g, path, quiet))


def keepalived_check(g: Guest, path: str) -> tuple[int, str, str]:
    return _prepared(keepalived_check_run(g, path))


def haproxy_check_run(g: Guest, path: str, quiet: bool = False) -> "tuple[int, str, str] | tuple[ToolRun, bool]":
    """What ``haproxy -c [-q] -f path`` answers — at once (no such file), or as the tool run to do
    (reading the guest's file and a fault's injection happen here, on the event loop; the run
    touches only a temporary copy and the verdict cache, so it may go to a thread) and whether its
    verdict is cached already."""
    data = g.read_file(path)
    if data is None:
        return 1, "", f"[ALERT]    (1) : Cannot open configuration file/directory {path} : No such file or directory\n"
    data = _with_fault(g, path, data)
    args = ["-c", *(["-q"] if quiet else []), "-f", "{file}"]
    return (lambda: run_tool("haproxy", args, path, data)), cached("haproxy", args, data)


def keepalived_check_run(g: Guest, path: str) -> "tuple[int, str, str] | tuple[ToolRun, bool]":
    """``keepalived -t -f path`` as :func:`haproxy_check_run` gives ``haproxy -c``."""
    data = g.read_file(path)
    if data is None:
        return 1, "", f"Configuration file '{path}' does not exist\n"
    data = _with_fault(g, path, data)
    ifaces = guest_ifaces(g)
    args = ["-t", "-f", "{file}"]
    return (lambda: run_tool("keepalived", args, path, data, ifaces)), cached("keepalived", args, data, ifaces)


def _prepared(job: "tuple[int, str, str] | tuple[ToolRun, bool]") -> tuple[int, str, str]:
    if len(job) == 3:
        return job  # type: ignore[return-value]
    return job[0]()  # type: ignore[operator]


_TOOL_POOL: list[concurrent.futures.ThreadPoolExecutor] = []  # made at the first check that needs it


def _tool_pool() -> concurrent.futures.ThreadPoolExecutor:
    if not _TOOL_POOL:
        _TOOL_POOL.append(concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="z9-sim-tools"))
    return _TOOL_POOL[0]


def _tool_exec(ctx: ExecContext, job: "tuple[int, str, str] | tuple[ToolRun, bool]") -> ExecResult:
    """The check as an agent command: a verdict not cached yet runs the real tool in the
    simulator's thread pool (about 140 ms for ``haproxy -c``; the event loop serves every other
    request meanwhile) when the agent runs the command itself — the process runs until the tool
    has answered, as in a guest (qemu-ga's guest-exec answers the pid at once, guest-exec-status
    ``exited: 0`` until the process ends). Inside a shell (``systemctl reload``) the check runs to
    its end where it stands: the next command sees its verdict."""
    if len(job) == 3:
        code, out, err = job  # type: ignore[misc]
        return ExecResult(code, out=out, err=err)
    run, hit = job  # type: ignore[misc]
    if ctx.top and not hit:
        def in_thread() -> ExecResult:
            c, o, e = run()
            return ExecResult(c, out=o, err=e)
        return ExecResult(0, later=_tool_pool().submit(in_thread))
    code, out, err = run()
    return ExecResult(code, out=out, err=err)


@command("haproxy")
def _haproxy(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    if args in (["-v"], ["-vv"]):
        code, out, err = run_tool("haproxy", args, "", b"")
        return ExecResult(code, out=out, err=err)
    if "-c" in args and "-f" in args and args.index("-f") + 1 < len(args) \
            and set(args) - {args[args.index("-f") + 1]} <= {"-c", "-q", "-f"}:
        return _tool_exec(ctx, haproxy_check_run(ctx.guest, args[args.index("-f") + 1], quiet="-q" in args))
    return ExecResult(1, err="Usage : haproxy [-f <cfgfile|cfgdir>]* [ -vdVD ] [ -c ] ... (simulated: -c [-q] -f, -v)\n")


@command("keepalived")
def _keepalived(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    if args in (["-v"], ["--version"]):
        code, out, err = run_tool("keepalived", args, "", b"")
        return ExecResult(code, out=out, err=err)
    if len(args) == 3 and args[0] == "-t" and args[1] == "-f":
        return _tool_exec(ctx, keepalived_check_run(ctx.guest, args[2]))
    return ExecResult(1, err="keepalived: simulated only with -t -f FILE (the check) and -v\n")


@command("mv")
def _mv(ctx: ExecContext) -> ExecResult:
    args = [a for a in ctx.argv[1:] if not a.startswith("-")]
    if len(args) != 2:
        return ExecResult(1, err="mv: missing destination file operand\n")
    data = ctx.guest.read_file(args[0])
    if data is None:
        return ExecResult(1, err=f"mv: cannot stat '{args[0]}': No such file or directory\n")
    ctx.guest.write_file(args[1], data)
    ctx.guest.delete_file(args[0])
    return ExecResult(0)


@command("systemctl")
def _systemctl(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    if len(args) != 2 or args[0] not in ("reload", "restart", "start"):
        return ExecResult(1, err="systemctl: simulated only reload|restart|start <unit>\n")
    unit = args[1].removesuffix(".service")
    m = ctx.guest.model("appliance")
    m.setdefault("boot", ctx.guest.boot_id)
    if unit == "haproxy":
        # (the verdict of -c -q is -c's: asked without -q, a file just checked is a cache hit)
        code, _, _ = haproxy_check(ctx.guest, HAPROXY_CFG)
        if code != 0:
            return ExecResult(1, err="Job for haproxy.service failed because the control process exited with error "
                                     "code.\nSee \"systemctl status haproxy.service\" and \"journalctl -xeu "
                                     "haproxy.service\" for details.\n")
        m["haproxy"] = (ctx.guest.read_file(HAPROXY_CFG) or b"").decode("utf-8", "replace")
        m["reloads"] = int(m.get("reloads", 0)) + 1  # what a test counts (pushes that took effect)
        return ExecResult(0)
    if unit == "keepalived":
        code, _, _ = keepalived_check(ctx.guest, KEEPALIVED_CFG)
        if code != 0:
            return ExecResult(1, err="Job for keepalived.service failed.\n")
        m["keepalived"] = (ctx.guest.read_file(KEEPALIVED_CFG) or b"").decode("utf-8", "replace")
        return ExecResult(0)
    return ExecResult(5, err=f"Failed to {args[0]} {args[1]}.service: Unit {args[1]}.service not found.\n")


# ---------------------------------------------------------------- the active files as a model

def parse_haproxy(text: str) -> dict[str, Any]:
    """What the world needs of an (already checked) HAProxy file: {frontends: {name: {binds}},
    backends: {name: {servers: [(name, addr, port, check_port)], httpchk, expect}}}."""
    fe: dict[str, dict[str, Any]] = {}
    be: dict[str, dict[str, Any]] = {}
    cur: dict[str, Any] | None = None
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        kw = words[0]
        if kw in ("global", "defaults", "frontend", "backend", "listen", "resolvers", "peers", "userlist"):
            cur = None
            if kw in ("frontend", "backend", "listen") and len(words) > 1:
                cur = {"binds": [], "servers": [], "httpchk": None, "expect": None}
                if kw in ("frontend", "listen"):
                    fe[words[1]] = cur
                if kw in ("backend", "listen"):
                    be[words[1]] = cur
            continue
        if cur is None:
            continue
        if kw == "bind" and len(words) > 1:
            cur["binds"].append(words[1])
        elif kw == "server" and len(words) > 2 and ":" in words[2]:
            addr, port = words[2].rsplit(":", 1)
            check_port = int(words[words.index("port", 3) + 1]) if "port" in words[3:] else int(port)
            cur["servers"].append((words[1], addr, int(port), check_port))
        elif kw == "option" and words[1:2] == ["httpchk"]:
            cur["httpchk"] = words[-1] if len(words) > 2 else "/"
        elif kw == "http-check" and words[1:3] == ["expect", "rstatus"]:
            cur["expect"] = words[3] if len(words) > 3 else ".*"
    return {"frontends": fe, "backends": be}


def parse_keepalived(text: str) -> dict[str, Any]:
    """What the world needs of an (already checked) keepalived file: ``static`` [(cidr, dev)] and
    ``instances`` [{name, state, nopreempt, priority, vrid, interface, src, peers, auth, vips}]
    (one statement per line, a block opened by a trailing ``{`` and closed by a ``}`` line)."""
    model: dict[str, Any] = {"static": [], "instances": []}
    stack: list[str] = []
    inst: dict[str, Any] | None = None
    for raw in text.splitlines():
        words = re.split(r"[#!]", raw, maxsplit=1)[0].split()
        if not words:
            continue
        if words == ["}"]:
            if stack and stack.pop() == "vrrp_instance":
                inst = None
            continue
        if words[-1] == "{":
            stack.append(words[0])
            if words[0] == "vrrp_instance":
                inst = {"name": words[1] if len(words) > 2 else None, "state": None, "nopreempt": False,
                        "priority": 100, "vrid": None, "interface": None, "src": None, "peers": [],
                        "auth": (None, None), "vips": []}
                model["instances"].append(inst)
            continue
        w, rest = words[0], words[1:]
        block = stack[-1] if stack else None
        if block == "static_ipaddress":
            model["static"].append(_addr(w, rest))
        elif inst is None:
            continue
        elif block == "virtual_ipaddress":
            inst["vips"].append(_addr(w, rest))
        elif block == "unicast_peer":
            inst["peers"].append(w)
        elif block == "authentication":
            t, pw = inst["auth"]
            # keepalived keeps the first 8 characters of auth_pass (vrrp_parser.c)
            inst["auth"] = (rest[0] if w == "auth_type" and rest else t, rest[0][:8] if w == "auth_pass" and rest else pw)
        elif block == "vrrp_instance" and (rest or w == "nopreempt"):
            if w == "nopreempt":
                inst["nopreempt"] = True
            elif w == "state":
                inst["state"] = rest[0]
            elif w == "priority":
                inst["priority"] = int(rest[0])
            elif w == "virtual_router_id":
                inst["vrid"] = int(rest[0])
            elif w == "interface":
                inst["interface"] = rest[0]
            elif w == "unicast_src_ip":
                inst["src"] = rest[0]
    for i in model["instances"]:
        i["vips"] = [(c, d or i["interface"]) for c, d in i["vips"]]
    return model


def _addr(cidr: str, rest: list[str]) -> tuple[str, str | None]:
    dev = rest[rest.index("dev") + 1] if "dev" in rest and rest.index("dev") + 1 < len(rest) else None
    return str(ipaddress.ip_interface(cidr)), dev


# ---------------------------------------------------------------- the world: NICs, VIP, listeners, show stat

def predictable_names(g: Guest) -> None:
    """The appliance image keeps the kernel's predictable NIC names (``ethN`` → ``ens<18+N>``,
    qemu-server PCI.pm: ``net0`` at slot 18); an ordinary guest is left as cloud-init named it."""
    if g.models.get("appliance", {}).get("nic_names") != "predictable":
        return
    for n in g.net_applied:
        m = re.fullmatch(r"eth(\d+)", n["name"])
        if m:
            n["name"] = f"ens{18 + int(m.group(1))}"


def _running(guests: Guests, g: Guest) -> bool:
    vm = guests.cluster.vms.get(g.vmid)
    if vm is None or not vm.running:
        return False
    guests.get(g.vmid)  # advance its boot
    if g.powered and g.booted:
        boot_services(g)
        return True
    return False


def boot_services(g: Guest) -> None:
    """At each boot the enabled units start from the files on disk (a valid one only), as
    systemd does: what a reload activated before a reboot is what runs after it."""
    m = g.models.get("appliance")
    if m is None or m.get("boot") == g.boot_id:
        return
    m["boot"] = g.boot_id
    m.pop("haproxy", None)
    m.pop("keepalived", None)
    if g.read_file(HAPROXY_CFG) is not None and haproxy_check(g, HAPROXY_CFG)[0] == 0:
        m["haproxy"] = (g.read_file(HAPROXY_CFG) or b"").decode("utf-8", "replace")
    if g.read_file(KEEPALIVED_CFG) is not None and keepalived_check(g, KEEPALIVED_CFG)[0] == 0:
        m["keepalived"] = (g.read_file(KEEPALIVED_CFG) or b"").decode("utf-8", "replace")


def _filtered(guests: Guests, g: Guest, ip: str) -> bool:
    """The guest configured ``ip`` but its VM's IP filter drops what it sends from it (a guest
    taking an address it was not given): it never answers from there (:meth:`Firewall.refuses_source`)."""
    vm = guests.cluster.vms.get(g.vmid)
    return vm is not None and guests.cluster.firewall.refuses_source(g.vmid, vm.config, ip)


def _holds(g: Guest, ip: str) -> bool:
    return any(a.get("ip-address") == ip for i in g.interfaces() for a in i.get("ip-addresses", []))


def _own_ips(g: Guest) -> set[str]:
    return {str(ipaddress.ip_interface(a).ip) for n in g.net_applied for a in n["addresses"]}


def vip_holders(guests: Guests) -> dict[int, dict[str, list[str]]]:
    """{vmid: {dev: [cidr]}} as keepalived decides now: static addresses on their appliance, each
    VRRP domain's VIPs on one member (sticky holder: nopreempt)."""
    sticky: dict[str, int] = guests.__dict__.setdefault("_vip_holder", {})
    out: dict[int, dict[str, list[str]]] = {}
    members: list[tuple[Guest, dict[str, Any]]] = []
    for g in list(guests.guests.values()):
        conf = g.models.get("appliance", {}).get("keepalived")
        if not conf or not _running(guests, g):
            continue
        k = parse_keepalived(conf)
        for cidr, dev in k["static"]:
            out.setdefault(g.vmid, {}).setdefault(dev or "", []).append(cidr)
        for inst in k["instances"]:
            members.append((g, {**inst, "src": inst["src"] or next(iter(sorted(_own_ips(g))), None)}))
    # VRRP domains: same router id and authentication, each a unicast peer of the other
    domains: list[list[tuple[Guest, dict[str, Any]]]] = []
    for g, inst in members:
        for d in domains:
            if all(i["vrid"] == inst["vrid"] and i["auth"] == inst["auth"] and inst["src"] in i["peers"]
                   and i["src"] in inst["peers"] for _, i in d):
                d.append((g, inst))
                break
        else:
            domains.append([(g, inst)])
    seen: set[str] = set()
    for d in domains:
        vips = sorted({c for _, i in d for c, _ in i["vips"]})
        key = ",".join(vips)
        ids = {g.vmid: i for g, i in d}
        masters = _vrrp_masters(guests, d)
        if masters is not None:  # the firewall keeps some members from hearing others
            seen.add(key)
            for vmid in masters:
                for cidr, dev in ids[vmid]["vips"]:
                    out.setdefault(vmid, {}).setdefault(dev or "", []).append(cidr)
            continue
        holder = sticky.get(key)
        if holder not in ids or not ids[holder]["nopreempt"] or key in seen:
            holder = sorted(d, key=lambda p: (-p[1]["priority"], p[0].vmid))[0][0].vmid
            if key not in seen:
                sticky[key] = holder
        seen.add(key)
        for cidr, dev in ids[holder]["vips"]:
            out.setdefault(holder, {}).setdefault(dev or "", []).append(cidr)
    for key in [k for k in sticky if k not in seen]:
        del sticky[key]
    return out


def _vrrp_masters(guests: Guests, domain: list[tuple[Guest, dict[str, Any]]]) -> list[int] | None:
    """The members that are MASTER when the firewall keeps some from hearing others' adverts (None:
    every member hears every other — one master, as :func:`vip_holders` elects it). The adverts are
    IP protocol 112 (``vrrp``), or 51 (``ah``) with ``auth_type AH`` (keepalived's IPSEC-AH), sent
    unicast to each peer; whether each side hears the other is :func:`z9.sim.firewall.exchange`
    (conntrack makes one accepted direction carry the other). RFC 5798 §6.4: a backup that hears no
    advert from a master of higher priority becomes master when its Master_Down_Timer fires, and a
    master steps down only on an advert of higher priority — so a member is MASTER unless it hears a
    member that outranks it (higher priority; on a tie the lowest vmid, as elected above)."""
    cluster = guests.cluster
    if cluster is None or len(domain) < 2:
        return None
    from .firewall import exchange, nic_holding

    hears: dict[tuple[int, int], bool] = {}
    for i, (ga, ia) in enumerate(domain):
        for gb, ib in domain[i + 1:]:
            a = nic_holding(cluster, ga.vmid, ia["src"]) if ia["src"] else None
            b = nic_holding(cluster, gb.vmid, ib["src"]) if ib["src"] else None
            if a is None or b is None:
                continue
            proto = "ah" if str(ia["auth"][0] or "").upper() == "AH" else "vrrp"
            hears[(ga.vmid, gb.vmid)], hears[(gb.vmid, ga.vmid)], _ = exchange(cluster, a, b, proto)
    if all(hears.values()):
        return None

    def rank(p: tuple[Guest, dict[str, Any]]) -> tuple[int, int]:
        return (p[1]["priority"], -p[0].vmid)

    return [g.vmid for g, i in domain
            if not any(hears.get((g.vmid, o.vmid), True) for o, oi in domain
                       if o.vmid != g.vmid and rank((o, oi)) > rank((g, i)))]


def extra_interfaces(g: Guest) -> dict[str, list[str]]:
    """The addresses keepalived configured on the appliance (on the interface its file names)."""
    if "appliance" not in g.models:
        return {}
    predictable_names(g)
    return vip_holders(g.guests).get(g.vmid, {})


def listening(g: Guest) -> dict[str, Any]:
    return g.model("net").setdefault("listen", {})


def _probe(guests: Guests, addr: str, port: int, backend: dict[str, Any],
           prober: Guest | None = None) -> tuple[str, str, str]:
    """(status, check_status, check_code) of one backend server, from the world. ``prober``: the
    appliance whose HAProxy checks — its check's first packet (a TCP SYN from its own address) must
    pass the firewall (:func:`z9.sim.firewall.dropped`: the appliance's OUT chain, the target's IN
    chain): dropped → ``L4TOUT`` (the SYN goes unanswered), rejected (``PVEFW-reject``: a TCP reset) →
    ``L4CON``; why is kept in the appliance's model (``models.appliance.firewall``, ``GET
    /_sim/guests/{vmid}``) — HAProxy itself cannot tell a firewall from a dead host."""
    holder = None
    for g in guests.guests.values():
        if _running(guests, g) and "appliance" not in g.models and _holds(g, addr) and not _filtered(guests, g, addr):
            holder = g
            break
    if holder is None:
        return "DOWN", "L4TOUT", ""
    if prober is not None and guests.cluster is not None:
        from .firewall import dropped

        src = next(iter(sorted(_own_ips(prober))), None)
        verdicts = prober.model("appliance").setdefault("firewall", {})
        d = dropped(guests.cluster, prober.vmid, src, holder.vmid, addr, "tcp", port) if src else None
        if d is not None:
            verdicts[f"{addr}:{port}"] = d.reason
            return "DOWN", "L4CON" if d.rejected else "L4TOUT", ""
        verdicts.pop(f"{addr}:{port}", None)
    lst = listening(holder).get(str(port))
    if lst is None:
        return "DOWN", "L4CON", ""
    if backend.get("httpchk"):
        code = str(lst.get("http_status", 200))
        if backend.get("expect") and not re.fullmatch(backend["expect"], code):
            return "DOWN", "L7STS", code
        return "UP", "L7OK", code
    return "UP", "L4OK", ""


def show_stat(guests: Guests, conf: str, prober: Guest | None = None) -> str:
    model = parse_haproxy(conf)
    rows = []

    def row(px: str, sv: str, status: str, typ: int, chk: str = "", code: str = "") -> None:
        d = {c: "" for c in STAT_COLUMNS}
        d.update(pxname=px, svname=sv, status=status, type=str(typ), check_status=chk, check_code=code,
                 qcur="0", scur="0", stot="0", weight="1" if typ == 2 else "", act="1" if typ == 2 else "")
        rows.append(",".join(d[c] for c in STAT_COLUMNS))

    for name in model["frontends"]:
        row(name, "FRONTEND", "OPEN", 0)
    for name, b in model["backends"].items():
        ups = 0
        for sname, addr, _port, cport in b["servers"]:
            st, chk, code = _probe(guests, addr, cport, b, prober)
            ups += st == "UP"
            row(name, sname, st, 2, chk, code)
        row(name, "BACKEND", "UP" if ups else "DOWN", 1)
    return "# " + ",".join(STAT_COLUMNS) + "\n" + "\n".join(rows) + "\n\n"


@command("socat")
def _socat(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    if len(args) != 2 or args[0] not in ("stdio", "-"):
        return ExecResult(1, err="socat: simulated only: socat stdio <unix socket>\n")
    boot_services(ctx.guest)
    conf = ctx.guest.models.get("appliance", {}).get("haproxy")
    if args[1] != "/run/haproxy/admin.sock" or not conf:
        return ExecResult(1, err=f"socat E connect(5, AF=1 \"{args[1]}\", 23): No such file or directory\n")
    cmd = ctx.stdin.decode("utf-8", "replace").strip()
    if cmd == "show stat":
        return ExecResult(0, out=show_stat(ctx.guest.guests, conf, ctx.guest))
    return ExecResult(0, out="Unknown command. Please enter one of the following commands only :\n  show stat\n")


# keepalived's VIP shows in network-get-interfaces (once, however often this module is imported)
if extra_interfaces not in INTERFACE_PROVIDERS:
    INTERFACE_PROVIDERS.append(extra_interfaces)
