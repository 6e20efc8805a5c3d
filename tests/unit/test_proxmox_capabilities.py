"""The Proxmox adapter by capability (z9.executor.pve_capabilities): the client provides every
method of every narrow Protocol with the same signature, every public method belongs to one, and
only the adapter imports proxmoxer."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Protocol

from z9.executor import pve_capabilities as caps
from z9.executor.proxmox import ProxmoxClient

CAPABILITIES = [caps.Vms, caps.Tasks, caps.GuestAgent, caps.Firewall, caps.Storage, caps.CloudInit]


def _methods(cls: type) -> dict[str, inspect.Signature]:
    own = {n: v for c in cls.__mro__ if c not in (object, Protocol) for n, v in vars(c).items()}
    return {n: inspect.signature(v) for n, v in own.items() if callable(v) and not n.startswith("_")}


def test_the_client_provides_every_capability_with_its_signature() -> None:
    client = _methods(ProxmoxClient)
    for cap in CAPABILITIES:
        for name, sig in _methods(cap).items():
            assert name in client, f"ProxmoxClient lacks {cap.__name__}.{name}"
            assert str(client[name]) == str(sig), (cap.__name__, name, str(client[name]), str(sig))


def test_every_public_method_of_the_client_is_in_one_capability() -> None:
    owners: dict[str, list[str]] = {}
    for cap in CAPABILITIES:
        for name in _methods(cap):
            owners.setdefault(name, []).append(cap.__name__)
    assert all(len(v) == 1 for v in owners.values()), owners
    # close: the executor's; call: the error boundary a slice's own adapter calls through (volume/pve.py)
    extra = set(_methods(ProxmoxClient)) - set(owners) - {"close", "call"}
    assert not extra, f"ProxmoxClient methods in no capability: {sorted(extra)}"
    assert set(_methods(caps.Pve)) >= set(owners)


def test_only_the_adapter_imports_proxmoxer() -> None:
    root = Path(__file__).resolve().parents[2]
    importers = [str(f.relative_to(root)) for d in ("libs", "services", "resources", "z9")
                 for f in (root / d).rglob("*.py") if "proxmoxer" in f.read_text() and "import" in f.read_text()
                 and any(l.lstrip().startswith(("import proxmoxer", "from proxmoxer")) for l in f.read_text().splitlines())]
    assert importers == ["services/executor/z9/executor/proxmox.py"], importers
