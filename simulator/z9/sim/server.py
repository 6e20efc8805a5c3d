"""Run the Proxmox VE simulator: in-process for tests (:func:`start_simulator`) or as ``z9 sim``
(:func:`main`).

Example (tests)::

    server = await start_simulator(SimConfig(task_seconds={"qmclone": 0.2}), cert_dir=tmp_path)
    api = ProxmoxAPI("127.0.0.1", port=server.port, user="root@pam", token_name="z9",
                     token_value=server.token_secret, verify_ssl=False)  # or verify_ssl=str(server.cert_path)
    ...
    await server.stop()

The dev region seed (:func:`seed_dev_region`): template 9000 ``debian-12`` on the first node
(``template: 1``, ``scsi0: local-lvm:base-9000-disk-0,size=2G``, cloud-init drive on ide2, ``net0``
virtio on ``vmbr0``, tags ``z9-image`` so clones inherit it, facts: "Where peers broke" 8) and the
region agent VM 100 ``z9-agent-<region>`` on the first node, running, tagged ``z9-role-agent``.

A template as image builders leave one (:func:`put_builder_template`, for tests): the builder's own
cloud-init values and a NoCloud seed ISO of its own, which every clone inherits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Literal

from aiohttp import web
from pydantic import BaseModel, Field

from .api import SimContext, create_app
from .cluster import VM, Cluster
from .firewall import FirewallClock
from .guest import GuestSettings
from .faults import FaultStore
from .tls import ensure_certificate, server_context

log = logging.getLogger("z9.sim")

DEV_TOKEN_SECRET = "5f0c7a8e-2b1d-4c3e-9a6f-7d8e9f0a1b2c"


class SimConfig(BaseModel):
    """Simulator settings. Durations in seconds."""

    region: str = "dev-1"
    nodes: list[str] = Field(default_factory=lambda: ["pve1", "pve2", "pve3"], min_length=1)
    token_id: str = "root@pam!z9"  # USER@REALM!TOKENID
    token_secret: str = DEV_TOKEN_SECRET
    password: str = "z9-dev-password"  # for POST /access/ticket as the token's user
    task_seconds: dict[str, float] = Field(default_factory=dict)  # task type -> duration
    task_default_s: float = 0.2  # duration of task types not in task_seconds
    stats_lag_s: float = 10.0  # period of the /cluster/resources name/status cache
    task_invisible_s: float = 0.0  # a new UPID answers "no such task" for this long
    # delay of 401 replies: pve-http-server AnyEvent.pm "always delay unauthorized calls by 3 seconds";
    # tests that need a fast 401 pass 0 explicitly (tests/support.py SIM_TIMING)
    auth_delay_s: float = 3.0
    seed: Literal["dev", "empty"] = "dev"  # initial VMs (and what /_sim/reset restores)
    state_file: Path | None = None  # load VMs at start if present; save periodically and at stop
    state_save_s: float = 5.0
    guest_boot_s: float = 1.0  # from a VM's start to its guest agent answering
    cloud_init_s: float = 1.0  # cloud-init runs this long after the boot
    seed_vms: int = Field(0, ge=0, le=200_000)  # customer-shaped VMs added to the seed (scale runs)
    # the clock pve-firewall's 10 s compile cycle runs on (z9.sim.firewall): "real" — seconds since the
    # start, as on a node; "manual" — it moves only when POST /_sim/firewall/clock steps it (tests)
    firewall_clock: Literal["real", "manual"] = "real"


SCALE_FIRST_VMID = 10_000


def scale_vms(n: int, nodes: list[str], first_vmid: int = SCALE_FIRST_VMID) -> list[VM]:
    """``n`` VMs shaped like z9's clones (tags ``z9-id-…``/``z9-member-main``/``z9-role-customer``,
    a cloud-init drive, ``net0``, a 20 GiB disk; a quarter of them running), spread round-robin
    over ``nodes``, at vmids ``first_vmid`` … — a region at scale (issue 13 §4)."""
    vms = []
    now = time.time()
    for i in range(n):
        vmid = first_vmid + i
        running = i % 4 == 0
        vms.append(VM(vmid, nodes[i % len(nodes)], {
            "name": f"srv-{i:05d}", "cores": "2", "memory": "2048", "ostype": "l26", "agent": "1",
            "scsihw": "virtio-scsi-single", "scsi0": f"local-lvm:vm-{vmid}-disk-0,size=20G",
            "ide2": f"local-lvm:vm-{vmid}-cloudinit,media=cdrom", "boot": "order=scsi0",
            "net0": f"virtio=BC:24:11:{(i >> 16) & 255:02X}:{(i >> 8) & 255:02X}:{i & 255:02X},bridge=vmbr0",
            "ipconfig0": f"ip=10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255 or 1}/8,gw=10.0.0.1",
            "tags": f"z9-id-{uuid.UUID(int=i)};z9-image;z9-member-main;z9-role-customer",
            "smbios1": f"uuid={uuid.UUID(int=vmid)}", "vmgenid": str(uuid.UUID(int=vmid + 1)),
        }, running=running, started_at=now if running else None))
    return vms


def seed_dev_region(config: SimConfig) -> list[VM]:
    """The dev region's VMs (fresh objects on every call), plus ``seed_vms`` scale VMs."""
    extra = scale_vms(config.seed_vms, config.nodes) if config.seed_vms else []
    if config.seed == "empty":
        return extra
    node = config.nodes[0]
    template = VM(9000, node, {
        "name": "debian-12", "template": "1", "cores": "1", "memory": "1024", "ostype": "l26",
        "scsihw": "virtio-scsi-single", "scsi0": "local-lvm:base-9000-disk-0,size=2G",
        "ide2": "local-lvm:vm-9000-cloudinit,media=cdrom", "boot": "order=scsi0",
        "net0": "virtio=BC:24:11:90:00:00,bridge=vmbr0", "serial0": "socket", "vga": "serial0",
        "agent": "1", "tags": "z9-image", "smbios1": "uuid=9a9e1c52-0f6a-4f4e-a0c8-000000009000",
        "vmgenid": "4a3c2b1d-0000-4000-8000-000000009000",
    })
    agent = VM(100, node, {
        "name": f"z9-agent-{config.region}", "cores": "2", "memory": "2048", "ostype": "l26",
        "scsihw": "virtio-scsi-single", "scsi0": "local-lvm:vm-100-disk-0,size=8G",
        "ide2": "local-lvm:vm-100-cloudinit,media=cdrom", "boot": "order=scsi0",
        "net0": "virtio=BC:24:11:00:01:00,bridge=vmbr0", "ipconfig0": "ip=dhcp", "ciuser": "debian",
        "serial0": "socket", "vga": "serial0", "agent": "1", "tags": "z9-role-agent",
        "smbios1": f"uuid={uuid.UUID(int=100)}", "vmgenid": str(uuid.UUID(int=0x100)),
    }, running=True, started_at=time.time())
    images = [kubernetes_template(KUBERNETES_IMAGE_VMID + int(release.split(".")[1]), node, name, release)
              for name, release in KUBERNETES_IMAGES.items()]
    return [template, *images, agent, *extra]


#: The dev region's cluster images: Debian 12 with kubeadm, kubelet and kubectl of one Kubernetes
#: release each (the Debian packages of pkgs.k8s.io, version ``<release>-1.1``), vmid 9100 + minor.
#: ``z9 dev`` (and the tests) declare them in the region's ``kubernetes_images``.
KUBERNETES_IMAGES = {"debian-12-k8s-1.29": "1.29.15", "debian-12-k8s-1.30": "1.30.14",
                     "debian-12-k8s-1.31": "1.31.13", "debian-12-k8s-1.32": "1.32.9",
                     "debian-12-k8s-1.33": "1.33.5", "debian-12-k8s-1.34": "1.34.1"}
KUBERNETES_IMAGE_VMID = 9100


def kubernetes_template(vmid: int, node: str, name: str, release: str, *,
                        kubelet: str | None = None) -> VM:
    """A template as a Kubernetes image builder leaves it (kubernetes-sigs/image-builder's Proxmox
    builds, a Packer recipe running ``apt-get install kubeadm=<v> kubelet=<v> kubectl=<v>``): the seed
    template's shape, and a disk whose dpkg database holds the three packages of ``release``
    (``kubelet``: another release for the kubelet — an image built wrong)."""
    from .guest import DPKG_STATUS, dpkg_status

    packages = {"kubeadm": f"{release}-1.1", "kubectl": f"{release}-1.1", "kubelet": f"{kubelet or release}-1.1"}
    return VM(vmid, node, {
        "name": name, "template": "1", "cores": "1", "memory": "1024", "ostype": "l26",
        "scsihw": "virtio-scsi-single", "scsi0": f"local-lvm:base-{vmid}-disk-0,size=4G",
        "ide2": f"local-lvm:vm-{vmid}-cloudinit,media=cdrom", "boot": "order=scsi0",
        "net0": f"virtio=BC:24:11:91:{vmid % 100:02d}:00,bridge=vmbr0", "serial0": "socket", "vga": "serial0",
        "agent": "1", "tags": "z9-image", "smbios1": f"uuid={uuid.UUID(int=vmid)}",
        "vmgenid": str(uuid.UUID(int=vmid + 3)),
    }, disk_files={DPKG_STATUS: dpkg_status(packages)})


# the image builder's key (a real public key: PVE refuses one ssh-keygen cannot read)
BUILDER_SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGyFYeKcD3kOvJ0Iqv0tVhUw2FvDkm9wcmUNx3XUkfLu builder@image-factory"


def put_builder_template(cluster: Cluster, vmid: int = 9001, name: str = "debian-12-baked",
                         node: str | None = None, seed_drive: str = "sata0") -> VM:
    """A template as an image builder (Packer's proxmox builder, a pulumi-proxmoxve program — the class of
    pulumi-proxmoxve#13) leaves it: the builder's ``sshkeys`` and ``ciuser`` still in the config, and the
    builder's NoCloud seed (``local:iso/<name>-seed.iso``: hostname ``builder``, the builder's key,
    instance-id ``<name>-build``) on ``seed_drive`` next to PVE's drive on ``ide2``. PVE's clone copies
    every key and keeps a CD-ROM's ISO as it is (qemu-server ``clone_vm``: CD-ROMs are not cloned, their
    value is copied), so each clone inherits both; on ``sata0`` (``/dev/sr1``, after ``ide2``'s
    ``/dev/sr0``) the seed is the one NoCloud takes. Returns the template (added to ``cluster``)."""
    from urllib.parse import quote

    from z9.common.nocloud import build_nocloud_iso

    from .storage import Volume

    node = node or cluster.nodes[0]
    iso = build_nocloud_iso(f"#cloud-config\nhostname: builder\nssh_authorized_keys:\n  - {BUILDER_SSH_KEY}\n",
                            f"instance-id: {name}-build\nlocal-hostname: builder\n")
    volname = f"iso/{name}-seed.iso"
    cluster.storage._bucket("local", node)[volname] = Volume(f"local:{volname}", "iso", "iso", iso, int(time.time()))
    vm = VM(vmid, node, {
        "name": name, "template": "1", "cores": "1", "memory": "1024", "ostype": "l26",
        "scsihw": "virtio-scsi-single", "scsi0": f"local-lvm:base-{vmid}-disk-0,size=2G",
        "ide2": f"local-lvm:vm-{vmid}-cloudinit,media=cdrom", seed_drive: f"local:{volname},media=cdrom",
        "boot": "order=scsi0", "net0": "virtio=BC:24:11:90:01:01,bridge=vmbr0", "serial0": "socket",
        "vga": "serial0", "agent": "1", "tags": "z9-image", "ciuser": "builder",
        "sshkeys": quote(BUILDER_SSH_KEY + "\n", safe=""), "ipconfig0": "ip=dhcp",
        "smbios1": f"uuid={uuid.UUID(int=vmid)}", "vmgenid": str(uuid.UUID(int=vmid + 7)),
    })
    cluster.add_vm(vm)
    return vm


class SimServer:
    """A running simulator. ``url`` is ``https://<host>:<port>`` (proxmoxer adds ``/api2/json``),
    ``admin_url`` is ``<url>/_sim``; ``cluster`` gives tests direct access to the state.

    The simulator listens once per node, as a cluster has one pveproxy per node: ``url``/``port`` is the
    first node's API, ``node_urls``/``node_ports`` map every node to its own. The PVE API is the same on
    all of them except where PVE differs by receiving node (uploads: :mod:`z9.sim.storage`)."""

    def __init__(self, config: SimConfig, ctx: SimContext, runner: web.AppRunner, host: str, port: int,
                 cert_path: Path, key_path: Path):
        self.config = config
        self.ctx = ctx
        self.cluster: Cluster = ctx.cluster
        self.faults: FaultStore = ctx.faults
        self._runner = runner
        self.host = host
        self.port = port
        self.url = f"https://{host}:{port}"
        self.admin_url = f"{self.url}/_sim"
        self.cert_path = cert_path
        self.key_path = key_path
        self.token_id = config.token_id
        self.token_secret = config.token_secret
        self._saver: asyncio.Task | None = None
        self.node_ports: dict[str, int] = {n: p for p, n in ctx.port_nodes.items()}
        self.node_urls: dict[str, str] = {n: f"https://{host}:{p}" for n, p in self.node_ports.items()}

    @property
    def auth_header(self) -> dict[str, str]:
        return {"Authorization": f"PVEAPIToken={self.token_id}={self.token_secret}"}

    async def reset(self) -> None:
        """Same as ``POST /_sim/reset``."""
        self.ctx.faults.clear()
        self.ctx.requests.clear()
        self.ctx.request_log.clear()
        await self.cluster.reset(seed_dev_region(self.config))

    def save_state(self) -> None:
        if not self.config.state_file:
            return
        path = Path(self.config.state_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        # 0600 from the first byte: the state holds the guests' files — clusters' CA, etcd and
        # service-account private keys, join tokens
        tmp = path.with_suffix(path.suffix + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o600)
            f.write(json.dumps(self.cluster.dump(), indent=1, sort_keys=True))
        os.replace(tmp, path)

    async def _save_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.state_save_s)
            try:
                self.save_state()
            except OSError as e:  # pragma: no cover
                log.warning("cannot save state: %s", e)

    async def stop(self) -> None:
        if self._saver:
            self._saver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._saver
        await self.cluster.stop()
        with contextlib.suppress(OSError):
            self.save_state()
        await self._runner.cleanup()


async def start_simulator(config: SimConfig | None = None, host: str = "127.0.0.1", port: int = 0,
                          cert_dir: Path | str | None = None) -> SimServer:
    """Start the simulator on ``host:port`` (0 = any free port) with TLS; return when it listens.

    ``cert_dir`` holds the self-signed certificate (created if missing; a temp dir if None)."""
    config = config or SimConfig()
    cert_path, key_path = ensure_certificate(cert_dir or tempfile.mkdtemp(prefix="z9-sim-"))
    cluster = Cluster(config.nodes, task_seconds=config.task_seconds, task_default_s=config.task_default_s,
                      stats_lag_s=config.stats_lag_s, task_invisible_s=config.task_invisible_s,
                      guest=GuestSettings(boot_s=config.guest_boot_s, cloud_init_s=config.cloud_init_s),
                      firewall_clock=FirewallClock(manual=config.firewall_clock == "manual"))
    vms = seed_dev_region(config)
    if config.state_file and Path(config.state_file).exists():
        saved = json.loads(Path(config.state_file).read_text())
        vms = Cluster.vms_from_dump(saved)
        cluster.firewall.load(saved.get("firewall") or {})
        cluster.storage.load(saved.get("storage") or {})
        cluster.guests.load(saved.get("guests") or {})
        cluster.guests.load_shared(saved.get("guest_models"))
    for vm in vms:
        cluster.add_vm(vm)
    await cluster.start()
    ctx = SimContext(cluster=cluster, seed=lambda: seed_dev_region(config), token_id=config.token_id,
                     token_secret=config.token_secret, password=config.password, auth_delay_s=config.auth_delay_s)
    runner = web.AppRunner(create_app(ctx), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=server_context(cert_path, key_path))
    await site.start()
    bound_port = runner.addresses[0][1]
    ctx.port_nodes[bound_port] = config.nodes[0]
    for node in config.nodes[1:]:  # one listener per node (its pveproxy)
        before = {a[1] for a in runner.addresses}
        await web.TCPSite(runner, host, 0, ssl_context=server_context(cert_path, key_path)).start()
        for port in {a[1] for a in runner.addresses} - before:
            ctx.port_nodes[port] = node
    server = SimServer(config, ctx, runner, host, bound_port, cert_path, key_path)
    if config.state_file:
        server._saver = asyncio.create_task(server._save_forever())
    return server


def _parse_task_seconds(text: str) -> tuple[dict[str, float], float | None]:
    """``0.5`` (all types) or ``qmclone=2,qmstart=0.5,default=0.3``."""
    try:
        return {}, float(text)
    except ValueError:
        pass
    out: dict[str, float] = {}
    default = None
    for part in text.split(","):
        k, _, v = part.partition("=")
        if k.strip() == "default":
            default = float(v)
        else:
            out[k.strip()] = float(v)
    return out, default


def _token_secret(path: Path | None) -> tuple[str, str]:
    """(secret, where it came from): ``path``'s first line, else ``$Z9_SIM_TOKEN_SECRET``, else the
    dev secret. Raises OSError/ValueError for an unreadable or empty file."""
    if path is not None:
        secret = path.read_text().strip()
        if not secret:
            raise ValueError(f"--token-secret-file {path} is empty")
        return secret, str(path)
    env = os.environ.get("Z9_SIM_TOKEN_SECRET", "").strip()
    if env:
        return env, "Z9_SIM_TOKEN_SECRET"
    return DEV_TOKEN_SECRET, "the built-in dev secret"


def main(argv: list[str] | None = None) -> int:
    """``z9 sim``: run a simulator until SIGINT/SIGTERM; prints one line with URL and token."""
    p = argparse.ArgumentParser(prog="z9 sim", description="Proxmox VE API simulator for z9")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8006)
    p.add_argument("--region", default="dev-1")
    p.add_argument("--nodes", default="pve1,pve2,pve3", help="comma-separated node names")
    p.add_argument("--cert-dir", type=Path, default=None, help="default: ~/.cache/z9-sim/<region>")
    p.add_argument("--task-seconds", default="1.0",
                   help="seconds per task: a number for all, or qmclone=3,qmstart=1,default=0.5")
    p.add_argument("--stats-lag-s", type=float, default=10.0)
    # The API token's secret: from a file or Z9_SIM_TOKEN_SECRET, never the command line (every
    # local user sees it with `ps`); without either, the well-known dev secret (a warning says so).
    p.add_argument("--token-secret-file", type=Path, default=None,
                   help="file holding the API token secret (default: $Z9_SIM_TOKEN_SECRET, else the dev secret)")
    p.add_argument("--auth-delay-s", type=float, default=3.0,
                   help="delay of a 401 (failed ticket or API token), as pveproxy (default: 3)")
    p.add_argument("--state-file", type=Path, default=None)
    p.add_argument("--empty", action="store_true", help="start without the dev seed VMs")
    p.add_argument("--seed-vms", type=int, default=0, metavar="N",
                   help="add N customer-shaped VMs over the nodes (vmids from 10000; a region at scale)")
    p.add_argument("--guest-boot-s", type=float, default=1.0, help="from a VM's start to its guest agent answering")
    p.add_argument("--cloud-init-s", type=float, default=1.0, help="how long cloud-init runs after the boot")
    args = p.parse_args(argv)
    per_type, default = _parse_task_seconds(args.task_seconds)
    try:
        token_secret, secret_from = _token_secret(args.token_secret_file)
    except (OSError, ValueError) as e:
        print(f"z9 sim: {e}", file=sys.stderr)
        return 2
    config = SimConfig(region=args.region, nodes=[n for n in args.nodes.split(",") if n],
                       token_secret=token_secret, task_seconds=per_type,
                       task_default_s=default if default is not None else 1.0, stats_lag_s=args.stats_lag_s,
                       auth_delay_s=args.auth_delay_s, state_file=args.state_file,
                       seed="empty" if args.empty else "dev", guest_boot_s=args.guest_boot_s,
                       cloud_init_s=args.cloud_init_s, seed_vms=args.seed_vms)
    cert_dir = args.cert_dir or Path.home() / ".cache" / "z9-sim" / args.region
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    async def serve() -> None:
        server = await start_simulator(config, args.host, args.port, cert_dir)
        print(f"z9 sim: region={config.region} url={server.url} token={server.token_id} (secret from "
              f"{secret_from}) cert={server.cert_path} admin={server.admin_url}", flush=True)
        if secret_from == "the built-in dev secret":
            print("z9 sim: warning: using the well-known dev token secret; pass --token-secret-file or "
                  "Z9_SIM_TOKEN_SECRET", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop()

    try:
        asyncio.run(serve())
    except OSError as e:
        print(f"z9 sim: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
