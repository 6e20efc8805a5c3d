"""The address jobs' pure parts (``z9.resources.address.jobs.shared``): plan ordering (tag before entry
on the new holder, entry before tag on an old one), primaries only on a stopped VM, the IP filter
only where every address of the VM is listed, locks waited on, ipconfig rendering, conflicts."""
from __future__ import annotations

import ipaddress
from datetime import datetime, timezone

import pytest

from z9.common.errors import PermanentError
from z9.resources.address.model import Address
from z9.resources.address.jobs import shared as _address
from z9.resources.address.jobs.shared import Holder, World, address_tag, config_ips, ipconfig0, same_ip
from z9.executor.proxmox import VmLocked, VmState

NOW = datetime.now(timezone.utc)
ADR = "adr_01jd0000000000000000000000"
SRV_A, SRV_B = "srv_01jd00000000000000000000aa", "srv_01jd00000000000000000000bb"


def address(kind: str = "floating", **over: object) -> Address:
    base = dict(id=ADR, tenant_id="ten_x", region="dev-1", pool_id="apl_x", pool_name="public", prefix=24,
                gateway=ipaddress.ip_address("198.51.100.1"), ip=ipaddress.ip_address("198.51.100.7"), family=4,
                kind=kind, name=None, dns_ptr=None, protect_delete=False, auto_delete=False, server_id=SRV_B,
                status="active", status_reason=None, status_before_delete=None, server_before_delete=None,
                delete_after=None, observed=None, observed_at=None, created_at=NOW, updated_at=NOW, deleted_at=None)
    base.update(over)
    return Address(**base)  # type: ignore[arg-type]


def vm(vmid: int, server: str, *extra_tags: str, running: bool = True, lock: str | None = None,
       **config: str) -> VmState:
    tags = frozenset({f"z9-id-{server}", "z9-role-customer", *extra_tags})
    cfg = {"net0": "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0", "digest": "d", **config}
    if lock:
        cfg["lock"] = lock
    return VmState(vmid=vmid, node="pve1", config=cfg, status="running" if running else "stopped", tags=tags)


def world(a: Address, *, target: Holder | None, holders: list[Holder] = (), enforce: bool = False) -> World:
    return World(a, a.server_id if target else None, target, list(holders), [], enforce, ["198.51.100.53"], True)


def names(steps: list) -> list[str]:
    return [f"{s.name}@{s.detail['vmid']}" for s in steps]


ENTRY = [{"cidr": "198.51.100.7", "comment": "z9"}]


def test_move_takes_entry_off_the_old_holder_before_its_tag_and_tags_the_new_one_first() -> None:
    a = address()
    old = Holder(vm(101, SRV_A, address_tag(ADR)), ENTRY)
    new = Holder(vm(102, SRV_B), None, {"enable": 0})
    steps = _address.plan(None, world(a, target=new, holders=[old], enforce=True))  # type: ignore[arg-type]
    assert names(steps) == ["remove_entry@101", "untag@101", "tag@102", "create_ipset@102", "add_entry@102",
                            "enable_ipfilter@102"]


def test_a_vm_without_a_filter_set_gets_none_while_not_enforced() -> None:
    # a DHCP server (nothing to enforce): its VM firewall is on (the server's policies), so a set
    # would filter by existing (pve-firewall generate_tap_rules) and drop its leased address
    a = address()
    new = Holder(vm(102, SRV_B), None, {"enable": 1})
    steps = _address.plan(None, world(a, target=new))  # type: ignore[arg-type]
    assert names(steps) == ["tag@102"]


def test_converged_plans_nothing() -> None:
    a = address()
    t = Holder(vm(102, SRV_B, address_tag(ADR), net0="virtio=AA,bridge=vmbr0,firewall=1"), ENTRY,
               {"enable": 1, "ipfilter": 1})
    assert _address.plan(None, world(a, target=t, enforce=True)) == []  # type: ignore[arg-type]
    assert _address.plan(None, world(a, target=None)) == []  # type: ignore[arg-type]


def test_ip_filter_only_when_enforced() -> None:
    a = address()
    t = Holder(vm(102, SRV_B, address_tag(ADR)), ENTRY, {"enable": 0})
    assert _address.plan(None, world(a, target=t)) == []  # type: ignore[arg-type]
    assert names(_address.plan(None, world(a, target=t, enforce=True))) == ["enable_ipfilter@102"]  # type: ignore[arg-type]


def test_primary_is_written_to_cloud_init_only_on_a_stopped_vm() -> None:
    a = address("primary")
    stopped = Holder(vm(102, SRV_B, address_tag(ADR), running=False), ENTRY)
    [step] = _address.plan(None, world(a, target=stopped))  # type: ignore[arg-type]
    assert step.name == "set_ipconfig"
    assert step.detail["ipconfig0"] == "ip=198.51.100.7/24,gw=198.51.100.1"
    assert step.detail["nameserver"] == "198.51.100.53"
    running = Holder(vm(102, SRV_B, address_tag(ADR)), ENTRY)
    with pytest.raises(PermanentError, match="running"):
        _address.plan(None, world(a, target=running))  # type: ignore[arg-type]
    done = Holder(vm(102, SRV_B, address_tag(ADR), ipconfig0="ip=198.51.100.7/24,gw=198.51.100.1",
                     nameserver="198.51.100.53"), ENTRY)
    assert _address.plan(None, world(a, target=done)) == []  # type: ignore[arg-type]


def test_a_locked_vm_is_waited_on_and_a_platform_vm_refused() -> None:
    a = address()
    with pytest.raises(VmLocked):
        _address.plan(None, world(a, target=Holder(vm(102, SRV_B, lock="backup"), None)))  # type: ignore[arg-type]
    agent = Holder(vm(102, SRV_B, "z9-role-agent"), None)
    with pytest.raises(PermanentError, match="not a customer VM"):
        _address.plan(None, world(a, target=agent))  # type: ignore[arg-type]


def test_helpers() -> None:
    assert same_ip("198.51.100.7/32", "198.51.100.7") and same_ip("198.51.100.7", "198.51.100.7")
    assert not same_ip("198.51.100.0/24", "198.51.100.7") and not same_ip("bogus", "198.51.100.7")
    assert config_ips({"ipconfig0": "ip=198.51.100.7/24,gw=198.51.100.1", "ipconfig1": "ip=dhcp",
                       "name": "x"}) == {"ipconfig0": "198.51.100.7"}
    six = address(family=6, ip=ipaddress.ip_address("2001:db8::7"), prefix=64, gateway=None)
    assert ipconfig0(six) == "ip6=2001:db8::7/64"
    assert _address.conflict_reason({"conflicts": [{"vmid": 300, "node": "pve2", "why": "ipconfig0 uses x"}]},
                                    "198.51.100.7").startswith("conflict: 198.51.100.7 is also used by a VM z9 does not manage")


def test_a_primary_taken_off_a_stopped_vm_leaves_its_cloud_init_on_dhcp() -> None:
    a = address("primary", server_id=None)
    old = Holder(vm(101, SRV_A, address_tag(ADR), running=False, ipconfig0="ip=198.51.100.7/24,gw=198.51.100.1"),
                 ENTRY)
    steps = _address.plan(None, world(a, target=None, holders=[old]))  # type: ignore[arg-type]
    # back on DHCP: the filter goes (its switch and its set), never the VM's firewall
    assert names(steps) == ["remove_entry@101", "clear_ipconfig@101", "disable_ipfilter@101", "untag@101"]
    running = Holder(vm(101, SRV_A, address_tag(ADR), ipconfig0="ip=198.51.100.7/24"), ENTRY)
    with pytest.raises(PermanentError, match="running"):
        _address.plan(None, world(a, target=None, holders=[running]))  # type: ignore[arg-type]
