"""Free TCP ports for the servers a test starts, outside the kernel's ephemeral range.

``bind(("127.0.0.1", 0))`` hands out a port of ``net.ipv4.ip_local_port_range`` — the range every
outgoing connection's source port is drawn from too: between the probe and the server's own bind, a
connection of this machine (a PostgreSQL client of another test worker, say) can take it, and the
server fails with EADDRINUSE (seen under load: an API of tests/integration/observability/test_ops.py).
So the ports come from below that range, each pytest-xdist worker from a block of its own, handed out
in turn within the process (never the same twice in a row of 2,000) and each checked bindable."""
from __future__ import annotations

import itertools
import os
import socket
import threading

_LOW = 10000
_BLOCK = 2000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    start = _LOW + (index % 64) * _BLOCK
    if start + _BLOCK > _ephemeral_low():  # no room below the ephemeral range: the kernel's choice
        return range(0)
    return range(start, start + _BLOCK)


_lock = threading.Lock()
_cycle = None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive ports, each free now and outside the ephemeral range."""
    global _cycle
    block = _block()
    if not block:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    with _lock:
        if _cycle is None:
            _cycle = itertools.cycle(block)  # a run too near the block's end is skipped below
        for _ in range(len(block)):
            first = next(_cycle)
            if first + count > block.stop:
                continue
            if all(_bindable(first + i) for i in range(count)):
                for _ in range(count - 1):
                    next(_cycle)
                return first
    raise RuntimeError(f"no {count} consecutive free ports in {block}")


def free_port() -> int:
    """A port free now, outside the ephemeral range (see the module docstring)."""
    return free_ports(1)
