"""The load balancer appliance model on the guest model (:mod:`z9.sim.guest` command handlers).

Everything follows from the files z9 wrote into the guest and the simulated world:

- ``haproxy -c -f FILE`` validates a real subset of HAProxy's grammar: known section keywords
  (``global``, ``defaults``, ``frontend``, ``backend``, ``listen``), every line of a proxy inside
  a section, unique proxy names, a ``bind`` address:port used at most once across the file,
  ``default_backend``/``use_backend`` naming an existing backend, ``server NAME ADDR:PORT``
  well-formed and unique in its backend, ``balance`` one of HAProxy's algorithms. Errors are
  HAProxy's ``[ALERT]`` lines (exit 1); valid: ``Configuration file is valid`` (exit 0).
- ``systemctl reload haproxy`` (or ``restart``/``start``) checks ``/etc/haproxy/haproxy.cfg``
  and activates it (a rejected file leaves the running one); ``systemctl reload keepalived``
  activates ``/etc/keepalived/keepalived.conf`` (checked as ``keepalived -t``).
- ``socat stdio /run/haproxy/admin.sock`` with ``show stat`` on stdin: the CSV of the *active*
  config, each backend server computed from the world: ``UP``/``L4OK`` (``L7OK`` for an
  ``option httpchk`` backend whose answer matches ``http-check expect``) only if a VM exists that
  is running, whose guest holds the server's address — and whose IP filter does not drop what it
  sends from it (a guest taking an address it was not given; :meth:`Firewall.refuses_source`) —
  and listens on the check port
  (``POST /_sim/guests/{vmid}/listen {port, http_status?}``); no VM holding the address →
  ``DOWN``/``L4TOUT``; held but not listening → ``DOWN``/``L4CON``; wrong HTTP status →
  ``DOWN``/``L7STS``.
- keepalived: the running appliances whose active keepalived config names the same VIP form a
  group; the VIP is held by exactly one of them: the current holder while it runs (``nopreempt``),
  else the running one with the highest ``priority`` (lowest vmid on a tie). It shows in the
  holder's ``network-get-interfaces`` (and ``ip addr``).
- A fault for tests (the only thing not derived from bytes): ``POST /_sim/appliance-faults
  {contains, message}`` makes ``haproxy -c`` reject any file containing ``contains`` with
  ``message`` (a HAProxy version that does not know a keyword, say).
"""
from __future__ import annotations

import ipaddress
import re
from typing import Any

from .guest import INTERFACE_PROVIDERS, ExecContext, ExecResult, Guest, Guests, command

SECTIONS = ("global", "defaults", "frontend", "backend", "listen", "resolvers", "peers", "userlist")
BALANCE = ("roundrobin", "static-rr", "leastconn", "first", "source", "uri", "url_param", "hdr", "random")
STAT_COLUMNS = ("pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,"
                "status,weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,"
                "type,rate,rate_lim,rate_max,check_status,check_code,check_duration").split(",")


def faults(guests: Guests) -> list[dict[str, str]]:
    return guests.__dict__.setdefault("_appliance_faults", [])


# ---------------------------------------------------------------- haproxy grammar

def parse_haproxy(text: str) -> tuple[list[str], dict[str, Any]]:
    """(alerts, model) of a HAProxy config: model = {frontends: {name: {binds, default_backend, mode}},
    backends: {name: {servers: [(name, addr, port, check_port)], httpchk, expect}}}."""
    alerts: list[str] = []
    fe: dict[str, dict[str, Any]] = {}
    be: dict[str, dict[str, Any]] = {}
    binds: dict[str, int] = {}
    sec, name, cur = None, None, None
    names: set[tuple[str, str]] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        kw = words[0]
        if kw in SECTIONS:
            sec, name = kw, (words[1] if len(words) > 1 else None)
            if sec in ("frontend", "backend", "listen"):
                if not name:
                    alerts.append(f"[ALERT]    (1) : config : parsing [cfg:{n}] : '{kw}' expects <name> as an argument.")
                    cur = {}
                    continue
                # a frontend and a backend may share a name; two proxies of one capability may not
                caps = {"frontend": ("fe",), "backend": ("be",), "listen": ("fe", "be")}[sec]
                if any((c, name) in names for c in caps):
                    alerts.append(f"[ALERT]    (1) : config : parsing [cfg:{n}] : proxy '{name}' has the same name "
                                  "as another proxy.")
                names.update((c, name) for c in caps)
                cur = {"binds": [], "default_backend": None, "servers": [], "httpchk": None, "expect": None,
                       "line": n}
                if sec in ("frontend", "listen"):
                    fe[name] = cur
                if sec in ("backend", "listen"):
                    be[name] = cur
            continue
        if sec is None:
            alerts.append(f"[ALERT]    (1) : config : parsing [cfg:{n}] : unknown keyword '{kw}' out of section.")
            continue
        if sec in ("global", "defaults") or cur is None:
            continue
        if kw == "bind":
            addr = words[1] if len(words) > 1 else ""
            m = re.fullmatch(r"(.*):(\d+)", addr)
            if not m or not 0 < int(m.group(2)) < 65536:
                alerts.append(f"[ALERT]    (1) : config : parsing [cfg:{n}] : '{kw}' : invalid address '{addr}'.")
                continue
            port = int(m.group(2))
            if port in binds:
                alerts.append(f"[ALERT]    (1) : config : parsing [cfg:{n}] : bind :{port} is already used by the "
                              f"proxy at line {binds[port]}.")
            binds[port] = n
            cur["binds"].append(port)
        elif kw in ("default_backend", "use_backend"):
            cur["default_backend"] = (words[1] if len(words) > 1 else "", n)
        elif kw == "balance":
            if len(words) < 2 or words[1] not in BALANCE:
                alerts.append(f"[ALERT]    (1) : config : parsing [cfg:{n}] : unknown balance algorithm "
                              f"'{words[1] if len(words) > 1 else ''}'.")
        elif kw == "server":
            if len(words) < 3 or not re.fullmatch(r"[^:]+:\d+", words[2]):
                alerts.append(f"[ALERT]    (1) : config : parsing [cfg:{n}] : 'server' expects <name> and "
                              "<addr>[:<port>] as arguments.")
                continue
            sname, (addr, port) = words[1], words[2].rsplit(":", 1)
            if any(s[0] == sname for s in cur["servers"]):
                alerts.append(f"[ALERT]    (1) : config : parsing [cfg:{n}] : server '{sname}' already defined.")
            check_port = int(port)
            if "port" in words[3:]:
                check_port = int(words[words.index("port", 3) + 1])
            cur["servers"].append((sname, addr, int(port), check_port))
        elif kw == "option" and words[1:2] == ["httpchk"]:
            cur["httpchk"] = words[-1] if len(words) > 2 else "/"
        elif kw == "http-check" and words[1:3] == ["expect", "rstatus"]:
            cur["expect"] = words[3] if len(words) > 3 else ".*"
    for fname, f in fe.items():
        db = f.get("default_backend")
        if db and db[0] not in be:
            alerts.append(f"[ALERT]    (1) : config : Proxy '{fname}': unable to find required default_backend: "
                          f"'{db[0]}'.")
    return alerts, {"frontends": fe, "backends": be}


def check_file(guests: Guests, text: str) -> list[str]:
    alerts, _ = parse_haproxy(text)
    for f in faults(guests):
        if f["contains"] in text:
            alerts.append(f.get("message") or f"[ALERT]    (1) : config : rejected by the simulator ({f['contains']})")
    return alerts


@command("haproxy")
def _haproxy(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    if len(args) == 3 and args[0] == "-c" and args[1] == "-f":
        data = ctx.guest.read_file(args[2])
        if data is None:
            return ExecResult(1, err=f"[ALERT]    (1) : Cannot open configuration file/directory {args[2]} : "
                                     "No such file or directory\n")
        alerts = check_file(ctx.guest.guests, data.decode("utf-8", "replace"))
        if alerts:
            return ExecResult(1, err="\n".join(alerts) + "\n[ALERT]    (1) : Fatal errors found in configuration.\n")
        return ExecResult(0, out="Configuration file is valid\n")
    if args in (["-v"], ["-vv"]):
        return ExecResult(0, out="HAProxy version 2.6.12-1+deb12u1 2023/12/16 - https://haproxy.org/\n")
    return ExecResult(1, err="Usage : haproxy [-f <cfgfile|cfgdir>]* [ -vdVD ] [ -c ] ... (simulated: -c -f, -v)\n")


# ---------------------------------------------------------------- keepalived

def parse_keepalived(text: str) -> tuple[list[str], dict[str, Any]]:
    alerts: list[str] = []
    model: dict[str, Any] = {"state": None, "nopreempt": False, "priority": 100, "vrid": None, "peers": [],
                             "vips": [], "src": None}
    block = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        if words[0] in ("unicast_peer", "virtual_ipaddress") and line.endswith("{"):
            block = words[0]
            continue
        if line == "}":
            block = None
            continue
        if block == "unicast_peer":
            model["peers"].append(words[0])
        elif block == "virtual_ipaddress":
            model["vips"].append(words[0])
        elif words[0] == "state":
            model["state"] = words[1]
        elif words[0] == "nopreempt":
            model["nopreempt"] = True
        elif words[0] == "priority":
            model["priority"] = int(words[1])
        elif words[0] == "virtual_router_id":
            model["vrid"] = int(words[1])
        elif words[0] == "unicast_src_ip":
            model["src"] = words[1]
    if model["vrid"] is None or not 1 <= model["vrid"] <= 255:
        alerts.append("(Line ?) virtual_router_id missing or out of range 1-255")
    if model["nopreempt"] and model["state"] != "BACKUP":
        alerts.append("(z9) nopreempt requires state BACKUP")
    for v in model["vips"]:
        try:
            ipaddress.ip_interface(v)
        except ValueError:
            alerts.append(f"Invalid virtual_ipaddress {v}")
    return alerts, model


@command("keepalived")
def _keepalived(ctx: ExecContext) -> ExecResult:
    args = ctx.argv[1:]
    if args[:1] == ["-t"] and args[1:2] == ["-f"] and len(args) == 3:
        data = ctx.guest.read_file(args[2])
        if data is None:
            return ExecResult(1, err=f"Configuration file '{args[2]}' does not exist\n")
        alerts, _ = parse_keepalived(data.decode("utf-8", "replace"))
        return ExecResult(1, err="\n".join(alerts) + "\n") if alerts else ExecResult(0)
    return ExecResult(1, err="keepalived: simulated only with -t -f FILE\n")


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
        data = ctx.guest.read_file("/etc/haproxy/haproxy.cfg")
        if data is None or check_file(ctx.guest.guests, data.decode("utf-8", "replace")):
            return ExecResult(1, err="Job for haproxy.service failed because the control process exited with error "
                                     "code.\n")
        m["haproxy"] = data.decode("utf-8", "replace")
        m["reloads"] = int(m.get("reloads", 0)) + 1  # what a test counts (pushes that took effect)
        return ExecResult(0)
    if unit == "keepalived":
        data = ctx.guest.read_file("/etc/keepalived/keepalived.conf")
        if data is None or parse_keepalived(data.decode("utf-8", "replace"))[0]:
            return ExecResult(1, err="Job for keepalived.service failed.\n")
        m["keepalived"] = data.decode("utf-8", "replace")
        return ExecResult(0)
    return ExecResult(5, err=f"Failed to {args[0]} {args[1]}.service: Unit {args[1]}.service not found.\n")


# ---------------------------------------------------------------- the world: listeners, VIP, show stat

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
    h = g.read_file("/etc/haproxy/haproxy.cfg")
    if h is not None and not check_file(g.guests, h.decode("utf-8", "replace")):
        m["haproxy"] = h.decode("utf-8", "replace")
    k = g.read_file("/etc/keepalived/keepalived.conf")
    if k is not None and not parse_keepalived(k.decode("utf-8", "replace"))[0]:
        m["keepalived"] = k.decode("utf-8", "replace")


def _filtered(guests: Guests, g: Guest, ip: str) -> bool:
    """The guest configured ``ip`` but its VM's IP filter drops what it sends from it (a guest
    taking an address it was not given): it never answers from there (:meth:`Firewall.refuses_source`)."""
    vm = guests.cluster.vms.get(g.vmid)
    return vm is not None and guests.cluster.firewall.refuses_source(g.vmid, vm.config, ip)


def _holds(g: Guest, ip: str) -> bool:
    return any(a.get("ip-address") == ip for i in g.interfaces() for a in i.get("ip-addresses", []))


def vip_holders(guests: Guests) -> dict[int, list[str]]:
    """{vmid: [vip cidr]} as keepalived decides now (sticky holder: nopreempt)."""
    sticky: dict[str, int] = guests.__dict__.setdefault("_vip_holder", {})
    groups: dict[str, list[tuple[int, int]]] = {}
    for g in list(guests.guests.values()):
        conf = g.models.get("appliance", {}).get("keepalived")
        if not conf or not _running(guests, g):
            continue
        _, k = parse_keepalived(conf)
        for v in k["vips"]:
            groups.setdefault(v, []).append((k["priority"], g.vmid))
    out: dict[int, list[str]] = {}
    for vip, members in groups.items():
        ids = [vmid for _, vmid in members]
        holder = sticky.get(vip)
        if holder not in ids:
            holder = sorted(members, key=lambda p: (-p[0], p[1]))[0][1]
            sticky[vip] = holder
        out.setdefault(holder, []).append(vip)
    for vip in [v for v in sticky if v not in groups]:
        del sticky[vip]
    return out


def extra_interfaces(g: Guest) -> dict[str, list[str]]:
    """The VIP on eth0 of the appliance holding it (keepalived)."""
    if "appliance" not in g.models:
        return {}
    vips = vip_holders(g.guests).get(g.vmid, [])
    return {"eth0": vips} if vips else {}


def listening(g: Guest) -> dict[str, Any]:
    return g.model("net").setdefault("listen", {})


def _probe(guests: Guests, addr: str, port: int, backend: dict[str, Any]) -> tuple[str, str, str]:
    """(status, check_status, check_code) of one backend server, from the world."""
    holder = None
    for g in guests.guests.values():
        if _running(guests, g) and "appliance" not in g.models and _holds(g, addr) and not _filtered(guests, g, addr):
            holder = g
            break
    if holder is None:
        return "DOWN", "L4TOUT", ""
    lst = listening(holder).get(str(port))
    if lst is None:
        return "DOWN", "L4CON", ""
    if backend.get("httpchk"):
        code = str(lst.get("http_status", 200))
        if backend.get("expect") and not re.fullmatch(backend["expect"], code):
            return "DOWN", "L7STS", code
        return "UP", "L7OK", code
    return "UP", "L4OK", ""


def show_stat(guests: Guests, conf: str) -> str:
    _, model = parse_haproxy(conf)
    rows = []

    def row(px: str, sv: str, status: str, typ: int, chk: str = "", code: str = "") -> None:
        d = {c: "" for c in STAT_COLUMNS}
        d.update(pxname=px, svname=sv, status=status, type=str(typ), check_status=chk, check_code=code,
                 qcur="0", scur="0", stot="0", weight="1" if typ == 2 else "", act="1" if typ == 2 else "")
        rows.append(",".join(d[c] for c in STAT_COLUMNS))

    for name, f in model["frontends"].items():
        row(name, "FRONTEND", "OPEN", 0)
    for name, b in model["backends"].items():
        ups = 0
        for sname, addr, _port, cport in b["servers"]:
            st, chk, code = _probe(guests, addr, cport, b)
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
        return ExecResult(0, out=show_stat(ctx.guest.guests, conf))
    return ExecResult(0, out="Unknown command. Please enter one of the following commands only :\n  show stat\n")


# keepalived's VIP shows in network-get-interfaces (once, however often this module is imported)
if extra_interfaces not in INTERFACE_PROVIDERS:
    INTERFACE_PROVIDERS.append(extra_interfaces)
