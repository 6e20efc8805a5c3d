"""Scale benchmark of the Proxmox VE simulator (issue 9): N VMs over M nodes, C concurrent clients.

Target: with 10,000 VMs over 10 nodes, ``GET /cluster/resources?type=vm`` and a VM's
``GET /nodes/{node}/qemu/{vmid}/config`` answer in <= 100 ms p99 with 16 concurrent clients.

The simulator runs in its own process (``z9 sim``'s code, over HTTPS, token auth and schema validation
as z9 uses it), seeded with N VMs shaped like z9's clones (tags, cloud-init drive, net0, disks; a
quarter of them running, their guests booted). The clients are C asyncio tasks in this process, each
with its own keep-alive HTTPS connection, issuing requests back to back for ``--seconds``; every
request's latency is recorded. One JSON line per endpoint: count, req/s, p50/p90/p99/max (ms),
response size (decoded and on the wire: the client accepts gzip, as proxmoxer does), plus ``load1`` (the machine's load when measured) and the parameters.

    .venv/bin/python bench/sim_scale.py                       # 10,000 VMs, 10 nodes, 16 clients, 20 s each
    .venv/bin/python bench/sim_scale.py --vms 1000 --nodes 3 --seconds 5     # a quick check

Run it on a quiet machine: the simulator and the clients share the CPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

TOKEN = "root@pam!z9"


def seed_vms(n: int, nodes: list[str]):
    from z9.sim.cluster import VM

    vms = []
    for i in range(n):
        vmid = 1000 + i
        node = nodes[i % len(nodes)]
        running = i % 4 == 0
        vms.append(VM(vmid, node, {
            "name": f"srv-{i:05d}", "cores": "2", "memory": "2048", "ostype": "l26", "agent": "1",
            "scsihw": "virtio-scsi-single", "scsi0": f"local-lvm:vm-{vmid}-disk-0,size=20G",
            "ide2": f"local-lvm:vm-{vmid}-cloudinit,media=cdrom", "boot": "order=scsi0",
            "net0": f"virtio=BC:24:11:{(i >> 16) & 255:02X}:{(i >> 8) & 255:02X}:{i & 255:02X},bridge=vmbr0",
            "ipconfig0": f"ip=10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255 or 1}/8,gw=10.0.0.1",
            "tags": f"z9-id-{uuid.UUID(int=i)};z9-image;z9-member-main",
            "smbios1": f"uuid={uuid.UUID(int=vmid)}", "vmgenid": str(uuid.UUID(int=vmid + 1)),
        }, running=running, started_at=time.time() if running else None))
    return vms


def serve(args) -> None:
    """Child process: run a simulator with the seeded VMs; print its port, serve until stdin closes."""
    from z9.sim.server import SimConfig, start_simulator

    async def main() -> None:
        nodes = [f"pve{i + 1}" for i in range(args.nodes)]
        cfg = SimConfig(nodes=nodes, seed="empty", stats_lag_s=10.0, token_secret="bench-secret")
        server = await start_simulator(cfg, cert_dir=args.cert_dir)
        for vm in seed_vms(args.vms, nodes):
            server.cluster.add_vm(vm)
        server.cluster.refresh_stats()
        print(json.dumps({"port": server.port}), flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)
        await server.stop()

    asyncio.run(main())


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def measure(port: int, paths, clients: int, seconds: float) -> dict:
    import aiohttp

    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"PVEAPIToken={TOKEN}=bench-secret"}
    lat: list[float] = []
    sizes: list[int] = []
    wire: list[int] = []
    errors = 0

    async def client(k: int) -> None:
        nonlocal errors
        rnd = random.Random(k)
        conn = aiohttp.TCPConnector(ssl=ctx, limit=1)
        async with aiohttp.ClientSession(connector=conn, headers=headers) as s:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                path = paths(rnd)
                t0 = time.perf_counter()
                async with s.get(f"https://127.0.0.1:{port}/api2/json{path}") as r:
                    body = await r.read()
                lat.append((time.perf_counter() - t0) * 1000)
                sizes.append(len(body))
                wire.append(r.content_length if r.content_length is not None else len(body))
                if r.status != 200:
                    errors += 1

    t0 = time.monotonic()
    await asyncio.gather(*(client(k) for k in range(clients)))
    wall = time.monotonic() - t0
    return {"count": len(lat), "req_s": round(len(lat) / wall, 1), "errors": errors,
            "p50_ms": round(pct(lat, 50), 2), "p90_ms": round(pct(lat, 90), 2), "p99_ms": round(pct(lat, 99), 2),
            "max_ms": round(max(lat), 2), "mean_ms": round(statistics.fmean(lat), 2),
            "bytes": int(statistics.median(sizes)), "wire_bytes": int(statistics.median(wire))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--vms", type=int, default=10_000)
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cert-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        serve(args)
        return 0
    cert_dir = tempfile.mkdtemp(prefix="z9-sim-bench-")
    child = subprocess.Popen([sys.executable, __file__, "--serve", "--vms", str(args.vms), "--nodes", str(args.nodes),
                              "--cert-dir", cert_dir], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        port = json.loads(line)["port"]
        nodes = [f"pve{i + 1}" for i in range(args.nodes)]
        common = {"vms": args.vms, "nodes": args.nodes, "clients": args.clients, "seconds": args.seconds}
        workloads = {
            "cluster_resources": lambda r: "/cluster/resources?type=vm",
            "vm_config": lambda r: (lambda i: f"/nodes/{nodes[i % len(nodes)]}/qemu/{1000 + i}/config")(
                r.randrange(args.vms)),
        }
        for name, paths in workloads.items():
            asyncio.run(measure(port, paths, args.clients, min(2.0, args.seconds)))  # warm-up
            res = asyncio.run(measure(port, paths, args.clients, args.seconds))
            print(json.dumps({"workload": f"sim_{name}", **common, **res, "load1": round(os.getloadavg()[0], 2),
                              "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}), flush=True)
    finally:
        child.stdin.close()
        child.wait(30)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
