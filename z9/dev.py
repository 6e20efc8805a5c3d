"""``z9 dev``: the whole stack on one machine with nothing to set up.

Starts, in order: PostgreSQL (embedded, data in ``<data dir>/pg``, kept across runs — unless
``Z9_DATABASE_URL`` is set), the migrations, a dev tenant and token (``<data dir>/dev-token``),
the Proxmox VE simulator as region ``dev-1`` (three nodes, a ``debian-12`` template, a region
agent VM tagged ``z9-role-agent``; its state in ``<data dir>/sim-state.json``, its URL in
``<data dir>/sim-url``), then the api,
scheduler, executor and reaper as separate processes. Ctrl-C stops everything, the database
included — and so does a ``z9 dev`` killed outright (SIGKILL): its services die with it
(``PR_SET_PDEATHSIG``) and a watchdog (:mod:`z9.pg_watchdog`) stops the database.

Metrics: every service serves Prometheus ``/metrics`` on a fixed local port of its own — the
scheduler on ``--metrics-port`` (9101), the executor on 9102, the reaper on 9103, the API on
9104 (never on its tenants' port, ``--port``) — and ``<data dir>/prometheus-targets.json`` lists
them as a Prometheus file_sd target file (one group per service, labelled ``service``). Services
log as text (``Z9_LOG_FORMAT=text``) unless ``Z9_LOG_FORMAT`` says otherwise. Each service gets
only the secrets it uses: the Proxmox token secret the executor, the installation key the api and
the executor; every file holding a secret is written 0600.
"""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import errno
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from z9 import pg_watchdog
from z9.common.files import write_private
from z9.common.pki import InstallationKey
from z9.common import store
from z9.common.db import connect
from z9.common.embedded_pg import EmbeddedPostgres
from z9.common.settings import Settings
from z9.db import migrate
from z9.sim.server import KUBERNETES_IMAGES

REGION = "dev-1"
# The dev region's address pool (documentation range TEST-NET-3, RFC 5737): the API syncs it
# into the database at start; POST /v1/addresses and public_ipv4 draw from it.
DEV_ADDRESS_POOLS = [{"name": "public", "cidr": "203.0.113.0/24", "gateway": "203.0.113.1",
                      "range": ["203.0.113.10", "203.0.113.250"], "nameservers": ["203.0.113.1"],
                      "bridge": "vmbr0"}]
SIM_TOKEN_ID = "root@pam!z9"

#: region dev-1's settings but its address and token (the simulator's seed: its images, its bridge's
#: networks, its nodes): ``z9 dev``'s, and the compose stack's (z9.env.example's Z9_REGIONS carries the
#: same, tests/unit/test_compose_region.py holds them equal)
DEV_REGION: dict = {
    "images": ["debian-12"],
    # the simulator's debian-12 template has a 2 GiB disk (simulator/z9/sim/server.py)
    "image_disk_gib": {"debian-12": 2}, "address_pools": DEV_ADDRESS_POOLS,
    # the simulator's Kubernetes images (debian-12-k8s-1.29 … 1.34): a cluster's version picks one
    "kubernetes_images": KUBERNETES_IMAGES,
    # the simulated bridge's DHCP network (10/8), where the region agent VM lives: never a
    # load balancer's ip target (resources/z9/resources/load_balancer/README.md)
    "platform_networks": ["10.0.0.0/8"],
    # every guest without a pool address (a server without a primary, cluster members)
    # gets its address here, chosen by z9, and the Proxmox IP filter holding exactly it
    "private_network": {"cidr": "172.16.0.0/16", "gateway": "172.16.0.1"},
    # every guest's DNS, written into its network-config (a pool's own nameservers win):
    # the private network's gateway, as a router running a resolver (dnsmasq) would be
    "nameservers": ["172.16.0.1"],
    # tenants' private networks (POST /v1/networks): a VXLAN zone between the nodes
    "sdn": {"type": "vxlan", "peers": ["192.0.2.11", "192.0.2.12", "192.0.2.13"]},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 120) -> None:
    # a child still alive is still starting: on a loaded machine (a CI running test files in
    # parallel, each with its own stack) importing the API alone has taken over 30 s
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"z9 dev: {what} exited with code {proc.returncode} while starting")
        if _port_busy(port):
            return
        time.sleep(0.1)
    raise SystemExit(f"z9 dev: {what} did not listen on port {port} within {timeout_s:.0f}s")


#: the services that talk to Proxmox: the executor, the API (a plan) and the reaper (drift detection)
PROXMOX_READERS = ("executor", "api", "reaper")


def _enable_datacenter_firewall(sim_port: int, secret: str) -> None:
    """Turn the simulated cluster's datacenter firewall on, as an operator of a real region must
    (Datacenter → Firewall → Options → Firewall: Yes; ``PUT /cluster/firewall/options enable=1``):
    pve-firewall compiles no VM's rules — so no IP filter z9 sets is enforced — while it is off
    (``src/PVE/Firewall.pm``: the cluster's ``enable`` gates every VM chain). Through the PVE API
    with z9's own token, like any client; already on: nothing changes."""
    import ssl
    import urllib.parse
    import urllib.request

    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the simulator's self-signed certificate
    url = f"https://127.0.0.1:{sim_port}/api2/json/cluster/firewall/options"
    auth = {"Authorization": f"PVEAPIToken={SIM_TOKEN_ID}={secret}"}
    with urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=30, context=ctx) as r:
        if str((json.loads(r.read()).get("data") or {}).get("enable", "0")) == "1":
            return
    body = urllib.parse.urlencode({"enable": 1}).encode()
    req = urllib.request.Request(url, data=body, method="PUT",
                                 headers={**auth, "Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(req, timeout=30, context=ctx):
        pass


async def _prepare_db(admin_url: str | None, url: str, token_file: Path) -> str:
    if admin_url:
        conn = await connect(admin_url, application_name="z9-dev")
        try:
            if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = 'z9'"):
                await conn.execute("CREATE DATABASE z9")
        finally:
            await conn.close()
    conn = await connect(url, application_name="z9-dev")
    try:
        await migrate(conn)
        if token_file.exists():
            token = token_file.read_text().strip()
            if await store.api_token_tenant(conn, token):
                return token
        async with conn.transaction():
            tenant = await store.tenant_upsert(conn, "dev")
            token = "z9t_" + secrets.token_urlsafe(32)
            await store.api_token_insert(conn, tenant, token, "dev")
        write_private(token_file, token + "\n")
        return token
    finally:
        await conn.close()


def _die_with_parent() -> None:
    """In a child, before exec: SIGTERM when ``z9 dev`` dies, however it dies (even SIGKILL),
    so no service outlives it (Linux ``PR_SET_PDEATHSIG``; nothing elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _spawn(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A child of ``z9 dev`` that never outlives it (:func:`_die_with_parent`)."""
    parent = os.getpid()

    def die_with_parent() -> None:
        _die_with_parent()
        if os.getppid() != parent:  # z9 dev died before the death signal was set: no signal comes
            os._exit(1)

    return subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent if sys.platform == "linux" else None)


def _start_watchdog(pgdata: Path, lockfile: Path) -> subprocess.Popen:
    """The process that stops the embedded PostgreSQL when ``z9 dev`` dies however it dies
    (:mod:`z9.pg_watchdog`): a pipe on its stdin, whose end the kernel closes with this process.
    Not a child that dies with it (no ``PR_SET_PDEATHSIG``), in a session of its own (a Ctrl-C is
    for ``z9 dev``); returns once it holds its lock."""
    proc = subprocess.Popen([sys.executable, "-m", "z9.pg_watchdog", str(pgdata), str(lockfile)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # "watching": the lock is held
    proc.stdout.close()
    return proc


def _say(text: str, *, err: bool = False) -> None:
    """Print, ignoring a closed output (``z9 dev | head``): losing a line must never skip the
    shutdown that follows it."""
    try:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)
    except (BrokenPipeError, OSError):
        pass


class DataDirLocked(Exception):
    """Another ``z9 dev`` holds the data directory."""


def lock_data_dir(data_dir: Path) -> int:
    """Take ``<data dir>/dev.lock`` (``flock``, released by the kernel when the process ends,
    however it ends); returns the open descriptor to keep. Raises :class:`DataDirLocked` naming
    the holder's pid when another ``z9 dev`` runs on the same folder: two would start two
    simulators on one state file and hand out the same vmid twice."""
    path = data_dir / "dev.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DataDirLocked(f"another z9 dev (pid {holder}) is running on {data_dir}; stop it first, "
                                "or pass another --data-dir") from None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


#: The services whose metrics ``z9 dev`` serves on ``--metrics-port`` + offset (the API's too:
#: never on its tenants' port).
METRICS_OFFSETS = {"scheduler": 0, "executor": 1, "reaper": 2, "api": 3}
#: Secrets z9 dev hands to the services that use them only (never through the inherited environment).
SECRET_VARIABLES = ("Z9_INSTALLATION_KEY", "Z9_INSTALLATION_KEY_FILE", "Z9_REGIONS")
SERVICES_WITH_INSTALLATION_KEY = ("api", "executor")


def metrics_ports(api_port: int, base: int) -> dict[str, int]:
    """``{service: port}`` of every service's ``/metrics`` in ``z9 dev``."""
    return {name: base + off for name, off in METRICS_OFFSETS.items()}


def write_prometheus_targets(path: Path, ports: dict[str, int]) -> None:
    """Write a Prometheus file_sd target file: ``[{"targets": ["127.0.0.1:<port>"],
    "labels": {"service": <name>}}]``, one group per service (written whole, then renamed)."""
    groups = [{"targets": [f"127.0.0.1:{port}"], "labels": {"service": name}} for name, port in ports.items()]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=2) + "\n")
    tmp.replace(path)


def _terminate(procs: list[subprocess.Popen], timeout_s: float = 30) -> None:
    """SIGTERM every process, wait up to ``timeout_s`` seconds in all, SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_dev(args: argparse.Namespace, settings: Settings) -> int:
    """Run the stack until Ctrl-C; returns the exit code."""
    data_dir = Path(args.data_dir or settings.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock_fd = lock_data_dir(data_dir)  # held until this process ends
    except DataDirLocked as e:
        print(f"z9 dev: {e}", file=sys.stderr)
        return 2
    try:
        return _run_locked(args, settings, data_dir)
    finally:
        os.close(lock_fd)


def _run_locked(args: argparse.Namespace, settings: Settings, data_dir: Path) -> int:
    if _port_busy(args.port):
        print(f"z9 dev: port {args.port} is in use; pass --port", file=sys.stderr)
        return 2
    ports = metrics_ports(args.port, args.metrics_port)
    busy = [f"{name} {port}" for name, port in ports.items() if _port_busy(port)]
    if busy:
        print(f"z9 dev: metrics port(s) in use ({', '.join(busy)}); pass --metrics-port", file=sys.stderr)
        return 2

    pg = None
    watchdog: subprocess.Popen | None = None
    if settings.database_url:
        url, admin_url = settings.database_url, None
    else:
        print("z9 dev: starting embedded PostgreSQL …", flush=True)
        watch_lock = data_dir / "pg-watchdog.lock"
        # a previous z9 dev killed outright: its watchdog may still be stopping that server
        if not pg_watchdog.wait_previous(watch_lock):
            print(f"z9 dev: the PostgreSQL of a previous z9 dev on {data_dir} is still stopping", file=sys.stderr)
            return 2
        pg = EmbeddedPostgres(data_dir / "pg").start()
        url, admin_url = pg.url("z9"), pg.url("postgres")
        watchdog = _start_watchdog(data_dir / "pg", watch_lock)

    children: list[tuple[str, subprocess.Popen]] = []
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    code = 0
    try:
        token = asyncio.run(_prepare_db(admin_url, url, data_dir / "dev-token"))
        write_private(data_dir / "database-url", url + "\n")  # for `z9 token`, psql, … (may hold a password)

        secret_file = data_dir / "sim-secret"
        if not secret_file.exists():
            write_private(secret_file, secrets.token_hex(16) + "\n")
        sim_secret = secret_file.read_text().strip()
        key_file = data_dir / "installation-key"  # seals every cluster's private keys (issue 11)
        if not key_file.exists():
            write_private(key_file, InstallationKey.generate() + "\n")
        sim_port = args.sim_port or _free_port()
        z9 = [sys.executable, "-m", "z9"]
        # The secret by file (0600), never on a command line; the children get it in Z9_REGIONS
        # (their environment is readable by this user only).
        sim = _spawn(z9 + [
            "sim", "--host", "127.0.0.1", "--port", str(sim_port), "--region", REGION,
            "--cert-dir", str(data_dir / "sim"), "--state-file", str(data_dir / "sim-state.json"),
            "--token-secret-file", str(secret_file), "--task-seconds", str(args.task_seconds)])
        children.append(("sim", sim))
        _wait_port(sim_port, sim, "the Proxmox VE simulator")
        (data_dir / "sim-url").write_text(f"https://127.0.0.1:{sim_port}\n")  # for scripts: SIM=$(cat …)/_sim
        _enable_datacenter_firewall(sim_port, sim_secret)

        env = {k: v for k, v in os.environ.items() if k not in SECRET_VARIABLES}
        env["Z9_DATABASE_URL"] = url
        region = {"url": f"https://127.0.0.1:{sim_port}", "token_id": SIM_TOKEN_ID, "verify_ssl": False,
                  **DEV_REGION}
        env.setdefault("Z9_LOG_FORMAT", "text")
        env.setdefault("Z9_METRICS_HOST", "127.0.0.1")
        # The executor looks at a task and a booting guest about as often as the simulator's tasks
        # last (--task-seconds; at most once a second, as against real PVE): with the 1 s default
        # poll, every step of a stack run with --task-seconds 0.05 still took a second.
        poll_s = f"{min(1.0, max(0.05, args.task_seconds)):g}"
        env.setdefault("Z9_TASK_POLL_S", poll_s)
        # A stop (Ctrl-C, or the death signal when z9 dev is killed, its database stopping at the
        # same moment) ends every service within this + 10 s, whatever it waits on (z9.common.shutdown)
        env.setdefault("Z9_SHUTDOWN_GRACE_S", "3")
        env.setdefault("Z9_SERVER_GUEST_POLL_S", poll_s)
        key = os.environ.get("Z9_INSTALLATION_KEY") or key_file.read_text().strip()
        for name, extra in (("api", ["--port", str(args.port)]), ("scheduler", []),
                            ("executor", ["--region", REGION]), ("reaper", [])):
            # each service only the secrets it uses (docs/settings.md): the Proxmox token secret
            # the executor, and the api and the reaper for plans (their client sends only GETs:
            # z9.executor.preview), the installation key the api and the executor
            own = {"Z9_METRICS_PORT": str(ports[name]),
                   "Z9_REGIONS": json.dumps({REGION: {**region, **({"token_secret": sim_secret}
                                                                 if name in PROXMOX_READERS else {})}})}
            if name in SERVICES_WITH_INSTALLATION_KEY:
                own["Z9_INSTALLATION_KEY"] = key
            children.append((name, _spawn(z9 + [name] + extra, env={**env, **own})))
        _wait_port(args.port, children[1][1], "the API")
        for name, proc in children[1:]:
            _wait_port(ports[name], proc, f"the {name}'s metrics")
        targets = data_dir / "prometheus-targets.json"
        write_prometheus_targets(targets, ports)

        api = f"http://127.0.0.1:{args.port}/v1"
        metrics_urls = "\n              ".join(f"http://127.0.0.1:{port}/metrics  ({name})"
                                                for name, port in ports.items())
        _say(f"""
z9 is running.
  API:        {api}
  console:    http://127.0.0.1:{args.port}/console/  (sign in with the token below)
  token:      {token}   (also in {data_dir / 'dev-token'})
  simulator:  https://127.0.0.1:{sim_port}  (region {REGION}; admin API under /_sim/; also in {data_dir / 'sim-url'})
  database:   {url}   (also in {data_dir / 'database-url'})
  metrics:    {metrics_urls}
              (Prometheus file_sd targets: {targets})
Try:
  export Z9={api} AUTH="Authorization: Bearer $(cat {data_dir / 'dev-token'})"
  curl -s -H "$AUTH" $Z9/servers
Ctrl-C stops everything.
""")
        while not stopping:
            for name, proc in children:
                if proc.poll() is not None:
                    _say(f"z9 dev: {name} exited with code {proc.returncode}; stopping the stack", err=True)
                    stopping, code = True, 1
                    break
            time.sleep(0.2)
    finally:
        _say("z9 dev: stopping …")
        # The services first (the executor finishes or hands over its jobs while the simulator
        # still answers), then the simulator, then the database.
        services = [p for name, p in children if name != "sim"]
        _terminate(services)
        _terminate([p for name, p in children if name == "sim"])
        if pg is not None:
            pg.stop()
        if watchdog is not None and watchdog.stdin is not None:
            watchdog.stdin.close()  # its end of file: it exits (nothing left to stop)
            watchdog.wait()
        _say("z9 dev: stopped")
    return code
