"""The simulator's appliance model (z9.sim.appliance): the real haproxy and keepalived judge the files
in the guest (through the guest agent's exec), the appliance image's NIC is ens18, and keepalived's
files decide who holds the VIP."""
from __future__ import annotations

import base64

import pytest

from tests.guest_tools import require_guest_tools
from tests.sim.conftest import wait_task
from tests.sim.test_sim_guest import agent_exec, until
from z9.sim.appliance import parse_haproxy, parse_keepalived

GOOD = """global
    stats socket /run/haproxy/admin.sock mode 660 level admin
defaults
    timeout connect 5s
    timeout client 5s
    timeout server 5s
frontend svc-80
    bind :80
    mode tcp
    default_backend svc-80
backend svc-80
    mode tcp
    balance roundrobin
    server srv_a 203.0.113.10:8080 check port 8080
"""

KEEPALIVED = """vrrp_instance z9 {{
    state BACKUP
    nopreempt
    interface {iface}
    virtual_router_id 7
    priority {prio}
    unicast_src_ip {me}
    unicast_peer {{
        {peer}
    }}
    authentication {{
        auth_type AH
        auth_pass {key}
    }}
    virtual_ipaddress {{
        203.0.113.10/24 dev {iface}
    }}
}}
"""


@pytest.fixture(autouse=True)
def tools() -> None:
    require_guest_tools()


def _appliance(admin, pve, vmid: int, ip: str, node: str = "pve1"):
    """A running VM of the appliance image (its guest disk state says so), address ``ip``."""
    admin("post", "/vms", json={"vmid": vmid, "node": node, "running": True, "config": {
        "name": f"app-{vmid}", "agent": "1", "net0": f"virtio=BC:24:11:00:{vmid % 100:02d}:01,bridge=vmbr0",
        "ide2": f"local-lvm:vm-{vmid}-cloudinit,media=cdrom", "ipconfig0": f"ip={ip}/24,gw=203.0.113.1"},
        "guest": {"models": {"appliance": {"nic_names": "predictable"}}}})
    vm = pve.nodes(node).qemu(vmid)
    until(lambda: vm.agent.ping.post())
    return vm


def _write(vm, path: str, text: str) -> None:
    vm.agent("file-write").post(file=path, content=base64.b64encode(text.encode()).decode(), encode=0)


def _ips(vm) -> dict[str, list[str]]:
    return {i["name"]: [a["ip-address"] for a in i["ip-addresses"] if a["ip-address-type"] == "ipv4"]
            for i in vm.agent("network-get-interfaces").get()["result"]}


def test_haproxy_c_is_the_real_one(admin, pve) -> None:
    vm = _appliance(admin, pve, 801, "203.0.113.21")
    _write(vm, "/etc/haproxy/haproxy.cfg.new", GOOD)
    r = agent_exec(vm, ["haproxy", "-c", "-f", "/etc/haproxy/haproxy.cfg.new"])
    assert r["exitcode"] == 0 and "Configuration file is valid" in r["out-data"], r
    _write(vm, "/etc/haproxy/haproxy.cfg.new", GOOD.replace("roundrobin", "fastest"))
    r = agent_exec(vm, ["haproxy", "-c", "-f", "/etc/haproxy/haproxy.cfg.new"])
    assert r["exitcode"] == 1, r
    # HAProxy's own words, naming the guest's file
    assert "[/etc/haproxy/haproxy.cfg.new:13] : balance only supports" in r["err-data"], r["err-data"]
    r = agent_exec(vm, ["haproxy", "-c", "-f", "/etc/haproxy/none.cfg"])
    assert r["exitcode"] == 1 and "No such file" in r["err-data"], r


def test_the_appliance_nic_is_ens18_and_keepalived_judges_the_file_against_it(admin, pve) -> None:
    vm = _appliance(admin, pve, 802, "203.0.113.22")
    assert _ips(vm)["ens18"] == ["203.0.113.22"] and "eth0" not in _ips(vm)
    conf = KEEPALIVED.format(iface="ens18", prio=100, me="203.0.113.22", peer="203.0.113.23", key="k3y-0123")
    _write(vm, "/etc/keepalived/keepalived.conf.new", conf)
    r = agent_exec(vm, ["keepalived", "-t", "-f", "/etc/keepalived/keepalived.conf.new"])
    assert r["exitcode"] == 0, r
    _write(vm, "/etc/keepalived/keepalived.conf.new", conf.replace("ens18", "eth0"))
    r = agent_exec(vm, ["keepalived", "-t", "-f", "/etc/keepalived/keepalived.conf.new"])
    assert r["exitcode"] != 0 and "interface eth0 for vrrp_instance z9 doesn't exist" in r["err-data"], r
    # keepalived 2.2.7 refuses a unicast source without peers (what lb-small had)
    _write(vm, "/etc/keepalived/keepalived.conf.new", conf.replace("        203.0.113.23\n", ""))
    r = agent_exec(vm, ["keepalived", "-t", "-f", "/etc/keepalived/keepalived.conf.new"])
    assert r["exitcode"] != 0 and "without any unicast peers" in r["err-data"], r


def test_an_ordinary_guest_keeps_cloud_inits_eth0(admin, pve) -> None:
    admin("post", "/vms", json={"vmid": 803, "node": "pve1", "running": True, "config": {
        "name": "plain", "agent": "1", "net0": "virtio=BC:24:11:00:03:01,bridge=vmbr0",
        "ide2": "local-lvm:vm-803-cloudinit,media=cdrom", "ipconfig0": "ip=203.0.113.24/24"}})
    vm = pve.nodes("pve1").qemu(803)
    until(lambda: vm.agent.ping.post())
    assert _ips(vm)["eth0"] == ["203.0.113.24"]


def test_an_injected_corruption_is_judged_by_the_real_tool(admin, pve) -> None:
    vm = _appliance(admin, pve, 804, "203.0.113.25")
    admin("post", "/appliance-faults", json={"contains": "203.0.113.10:8080", "inject": "    z9-bad on\n"})
    try:
        _write(vm, "/etc/haproxy/haproxy.cfg.new", GOOD)
        r = agent_exec(vm, ["haproxy", "-c", "-f", "/etc/haproxy/haproxy.cfg.new"])
        assert r["exitcode"] == 1 and "unknown keyword 'z9-bad' in 'backend' section" in r["err-data"], r
        data = vm.agent("file-read").get(file="/etc/haproxy/haproxy.cfg.new")["content"]
        assert data.endswith("    z9-bad on\n")   # the file on the guest's disk is the refused one
    finally:
        admin("delete", "/appliance-faults")
    _write(vm, "/etc/haproxy/haproxy.cfg.new", GOOD)
    assert agent_exec(vm, ["haproxy", "-c", "-f", "/etc/haproxy/haproxy.cfg.new"])["exitcode"] == 0


def _activate(vm, conf: str) -> None:
    _write(vm, "/etc/keepalived/keepalived.conf", conf)
    r = agent_exec(vm, ["systemctl", "reload", "keepalived"])
    assert r["exitcode"] == 0, r


def test_the_vip_follows_keepalived_files_one_holder_per_authenticated_pair(admin, pve) -> None:
    a = _appliance(admin, pve, 805, "203.0.113.31")
    b = _appliance(admin, pve, 806, "203.0.113.32", node="pve2")
    _activate(a, KEEPALIVED.format(iface="ens18", prio=100, me="203.0.113.31", peer="203.0.113.32", key="k3y-0123"))
    _activate(b, KEEPALIVED.format(iface="ens18", prio=99, me="203.0.113.32", peer="203.0.113.31", key="k3y-0123"))
    assert "203.0.113.10" in _ips(a)["ens18"] and "203.0.113.10" not in _ips(b)["ens18"]
    # another key on one side: each drops the other's adverts, both become MASTER (split brain)
    _activate(b, KEEPALIVED.format(iface="ens18", prio=99, me="203.0.113.32", peer="203.0.113.31", key="other-k3"))
    assert "203.0.113.10" in _ips(a)["ens18"] and "203.0.113.10" in _ips(b)["ens18"]
    # a static address (lb-small): on its appliance, no VRRP
    c = _appliance(admin, pve, 807, "203.0.113.33")
    _activate(c, "static_ipaddress {\n    203.0.113.40/24 dev ens18\n}\n")
    assert "203.0.113.40" in _ips(c)["ens18"]


def test_nopreempt_keeps_the_vip_where_a_failover_put_it(admin, pve) -> None:
    a = _appliance(admin, pve, 808, "203.0.113.34")
    b = _appliance(admin, pve, 809, "203.0.113.35", node="pve2")
    _activate(a, KEEPALIVED.format(iface="ens18", prio=100, me="203.0.113.34", peer="203.0.113.35", key="k3y-0123"))
    _activate(b, KEEPALIVED.format(iface="ens18", prio=99, me="203.0.113.35", peer="203.0.113.34", key="k3y-0123"))
    assert "203.0.113.10" in _ips(a)["ens18"]
    wait_task(pve, a.status.stop.post())
    until(lambda: "203.0.113.10" in _ips(b)["ens18"])          # the failover
    wait_task(pve, a.status.start.post())
    until(lambda: a.agent.ping.post())                          # back, with the higher priority
    assert "203.0.113.10" in _ips(b)["ens18"] and "203.0.113.10" not in _ips(a)["ens18"]


def test_the_models_read_what_the_world_needs() -> None:
    assert parse_haproxy(GOOD)["backends"]["svc-80"]["servers"] == [("srv_a", "203.0.113.10", 8080, 8080)]
    k = parse_keepalived(KEEPALIVED.format(iface="ens18", prio=99, me="203.0.113.32", peer="203.0.113.31",
                                           key="a-long-key-cut"))
    assert k["instances"][0]["auth"] == ("AH", "a-long-k")   # keepalived keeps 8 characters
    assert k["instances"][0]["vips"] == [("203.0.113.10/24", "ens18")]


def test_without_the_binary_the_appliance_says_so(admin, pve, monkeypatch) -> None:
    from z9.sim import appliance
    vm = _appliance(admin, pve, 810, "203.0.113.36")
    real = appliance.tool_path
    monkeypatch.setattr(appliance, "tool_path", lambda name: None if name == "haproxy" else real(name))
    _write(vm, "/etc/haproxy/haproxy.cfg.new", GOOD + "# not checked before\n")
    r = agent_exec(vm, ["haproxy", "-c", "-f", "/etc/haproxy/haproxy.cfg.new"])
    assert r["exitcode"] == 127 and "haproxy: not found" in r["err-data"] and "install" in r["err-data"], r


def test_a_check_the_agent_runs_does_not_hold_the_simulator(admin, pve, monkeypatch) -> None:
    """``haproxy -c`` runs in the simulator's thread pool (as its cloud-init schema check): while
    the real tool works, the exec's process runs (qemu-ga guest-exec answers the pid at once,
    guest-exec-status says ``exited: 0`` until the process ends) and other requests are answered."""
    import threading

    from z9.sim import appliance

    gate = threading.Event()
    real = appliance.run_tool

    def slow(*a, **kw):
        assert gate.wait(30), "the test never let the tool answer"
        return real(*a, **kw)

    monkeypatch.setattr(appliance, "run_tool", slow)
    vm = _appliance(admin, pve, 807, "203.0.113.27")
    _write(vm, "/etc/haproxy/haproxy.cfg.new", GOOD + "# held\n")
    pid = vm.agent.exec.post(command=["haproxy", "-c", "-f", "/etc/haproxy/haproxy.cfg.new"])["pid"]
    assert vm.agent("exec-status").get(pid=pid) == {"exited": 0}  # the check is still running...
    assert vm.status.current.get()["status"] == "running"  # ... and the simulator answers meanwhile
    gate.set()
    r = until(lambda: (lambda st: st if st["exited"] else None)(vm.agent("exec-status").get(pid=pid)), 30)
    assert r["exitcode"] == 0 and "Configuration file is valid" in r["out-data"], r
