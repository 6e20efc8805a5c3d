"""The guest models ask the firewall (z9.sim.firewall): an appliance's HAProxy check of a target the
firewall drops fails (``L4TOUT``; a REJECT resets it: ``L4CON``), keepalived's unicast VRRP splits
into two masters only when neither member's adverts get out (conntrack carries the other direction),
and a kubeadm join that cannot reach the API server (tcp 6443 on the endpoint) or, for a control
plane, etcd (tcp 2379-2380) fails as kubeadm does."""
from __future__ import annotations

import base64

import pytest
import yaml
from z9.common import pki
from z9.sim import kubeadm

from tests.guest_tools import require_guest_tools
from tests.sim.test_sim_guest import agent_exec, until
from tests.sim.test_sim_kubeadm import (
    EP,
    FLANNEL,
    init_config,
    install_kubernetes,
    kube_vip,
    write_pki,
)

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
    server srv_a {target}:8080 check port 8080
"""

KEEPALIVED = """vrrp_instance z9 {{
    state BACKUP
    interface ens18
    virtual_router_id 9
    priority {prio}
    unicast_src_ip {me}
    unicast_peer {{
        {peer}
    }}
    authentication {{
        auth_type AH
        auth_pass k3y-0123
    }}
    virtual_ipaddress {{
        203.0.113.50/24 dev ens18
    }}
}}
"""


@pytest.fixture
def fw_on(pve):
    pve.cluster.firewall.options.put(enable=1)
    yield
    pve.cluster.firewall.options.put(enable=0)


def _cycle(admin) -> None:
    admin("post", "/firewall/clock", json={"next_cycle": True})


def _guest(admin, pve, vmid: int, ip: str, *, appliance: bool = False, node: str = "pve1"):
    """A running guest behind the firewall bridge (net0 ``firewall=1``); ``appliance``: of the
    load balancer image (its NIC is ens18)."""
    body = {"vmid": vmid, "node": node, "running": True, "config": {
        # (2 cores, 2 GiB: kubeadm's preflight refuses a control plane below ControlPlaneNumCPU/-Mem)
        "name": f"g-{vmid}", "agent": "1", "cores": "2", "memory": "2048", "net0": f"virtio=BC:24:11:08:{vmid % 100:02d}:01,bridge=vmbr0,firewall=1",
        "ide2": f"local-lvm:vm-{vmid}-cloudinit,media=cdrom", "ipconfig0": f"ip={ip}/24,gw=203.0.113.1"}}
    if appliance:
        body["guest"] = {"models": {"appliance": {"nic_names": "predictable"}}}
    admin("post", "/vms", json=body)
    vm = pve.nodes(node).qemu(vmid)
    until(lambda: vm.agent.ping.post())
    return vm


def _write(vm, path: str, text: str) -> None:
    vm.agent("file-write").post(file=path, content=base64.b64encode(text.encode()).decode(), encode=0)


def _stat(vm) -> tuple[str, str]:
    r = agent_exec(vm, ["socat", "stdio", "/run/haproxy/admin.sock"], **{"input-data": "show stat\n"})
    rows = [line.split(",") for line in r["out-data"].splitlines() if line.startswith("svc-80,srv_a,")]
    header = r["out-data"].splitlines()[0][2:].split(",")
    return rows[0][header.index("status")], rows[0][header.index("check_status")]


def test_an_lb_target_the_firewall_drops_is_down_and_the_appliance_says_why(admin, pve, fw_on) -> None:
    require_guest_tools()
    app = _guest(admin, pve, 851, "203.0.113.151", appliance=True)
    _guest(admin, pve, 852, "203.0.113.152")
    admin("post", "/guests/852/listen", json={"port": 8080})
    _write(app, "/etc/haproxy/haproxy.cfg", GOOD.format(target="203.0.113.152"))
    assert agent_exec(app, ["systemctl", "reload", "haproxy"])["exitcode"] == 0
    _cycle(admin)
    assert _stat(app) == ("UP", "L4OK")
    target = pve.nodes("pve1").qemu(852).firewall
    target.options.put(enable=1)  # no rule: policy_in DROP (the default)
    assert _stat(app) == ("UP", "L4OK")  # not compiled yet
    _cycle(admin)
    assert _stat(app) == ("DOWN", "L4TOUT")
    why = admin("get", "/guests/851")["models"]["appliance"]["firewall"]["203.0.113.152:8080"]
    assert why == "VM 852 net0 in: no rule matched; policy_in DROP (the default: not set) decided"
    target.rules.post(type="in", action="ACCEPT", proto="tcp", dport="8080", source="203.0.113.151", enable=1)
    _cycle(admin)
    assert _stat(app) == ("UP", "L4OK")
    assert "203.0.113.152:8080" not in admin("get", "/guests/851")["models"]["appliance"]["firewall"]
    # REJECT answers the SYN with a reset: connection refused
    target.rules(0).put(action="REJECT")
    _cycle(admin)
    assert _stat(app) == ("DOWN", "L4CON")
    target.rules(0).put(action="ACCEPT")
    # the appliance's own OUT chain
    pve.nodes("pve1").qemu(851).firewall.options.put(enable=1, policy_out="DROP")
    _cycle(admin)
    assert _stat(app) == ("DOWN", "L4TOUT")
    why = admin("get", "/guests/851")["models"]["appliance"]["firewall"]["203.0.113.152:8080"]
    assert why == "VM 851 net0 out: no rule matched; policy_out DROP decided"


def _holds_vip(vm) -> bool:
    return any(a["ip-address"] == "203.0.113.50" for i in vm.agent("network-get-interfaces").get()["result"]
               for a in i["ip-addresses"])


@pytest.mark.parametrize("node_b", ["pve1", "pve2"])
def test_vrrp_splits_into_two_masters_only_when_no_advert_gets_out(admin, pve, fw_on, node_b) -> None:
    require_guest_tools()
    a = _guest(admin, pve, 853, "203.0.113.153", appliance=True)
    b = _guest(admin, pve, 854, "203.0.113.154", appliance=True, node=node_b)
    for vm, prio, me, peer in ((a, 100, "203.0.113.153", "203.0.113.154"), (b, 90, "203.0.113.154", "203.0.113.153")):
        _write(vm, "/etc/keepalived/keepalived.conf", KEEPALIVED.format(prio=prio, me=me, peer=peer))
        assert agent_exec(vm, ["systemctl", "reload", "keepalived"])["exitcode"] == 0
    fa, fb = pve.nodes("pve1").qemu(853).firewall, pve.nodes(node_b).qemu(854).firewall
    fa.options.put(enable=1)
    fb.options.put(enable=1)
    _cycle(admin)
    # both IN chains drop new VRRP/AH, but each one's adverts get out: the peer's are their replies
    assert (_holds_vip(a), _holds_vip(b)) == (True, False)
    fa.options.put(policy_out="DROP")
    _cycle(admin)
    assert (_holds_vip(a), _holds_vip(b)) == (True, False)  # b's still get out
    fb.options.put(policy_out="DROP")
    _cycle(admin)
    assert (_holds_vip(a), _holds_vip(b)) == (True, True)  # nothing gets out: two masters
    # keepalived's auth_type AH: the adverts are IP protocol 51, not VRRP's 112
    fb.rules.post(type="out", action="ACCEPT", proto="vrrp", dest="203.0.113.153", enable=1)
    _cycle(admin)
    assert (_holds_vip(a), _holds_vip(b)) == (True, True)
    fb.rules.post(type="out", action="ACCEPT", proto="ah", dest="203.0.113.153", enable=1)
    _cycle(admin)
    assert (_holds_vip(a), _holds_vip(b)) == (True, False)


def _run(sim_thread, guests, g, *argv: str):
    async def call():
        return guests.run_command(g, list(argv), b"", dict(guests.cluster.vms[g.vmid].config))  # (its VM's cores, memory)
    return sim_thread.run(call())


def test_a_member_that_cannot_reach_the_api_server_or_etcd_never_joins(sim, sim_thread, admin, pve, fw_on) -> None:
    kubeadm.SETTINGS["api_delay_s"] = 0.0
    for vmid in (861, 862, 863):
        _guest(admin, pve, vmid, f"203.0.113.{vmid - 700}")
    guests = sim.cluster.guests
    cp, worker, cp2 = (install_kubernetes(guests.guests[v]) for v in (861, 862, 863))
    material = pki.new_cluster_pki()
    write_pki(cp, material)
    cp.write_file(kubeadm.KUBE_VIP, kube_vip())
    cp.write_file("/etc/z9/kubeadm.yaml", init_config())
    assert _run(sim_thread, guests, cp, "kubeadm", "init", "--config", "/etc/z9/kubeadm.yaml").exitcode == 0
    assert _run(sim_thread, guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "apply", "-f", FLANNEL).exitcode == 0
    token = pki.new_bootstrap_token()
    assert _run(sim_thread, guests, cp, "kubeadm", "token", "create", token, "--ttl", "900s").exitcode == 0
    for g, name, control_plane in ((worker, "w-0", False), (cp2, "cp-1", True)):
        jc = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kind": "JoinConfiguration", "nodeRegistration": {"name": name},
              "discovery": {"bootstrapToken": {"apiServerEndpoint": EP, "token": token,
                                               "caCertHashes": [pki.ca_cert_hash(material["ca.crt"])]}}}
        if control_plane:
            jc["controlPlane"] = {}
            write_pki(g, material)
        g.write_file("/etc/z9/kubeadm.yaml", yaml.safe_dump(jc))
    fw = pve.nodes("pve1").qemu(861).firewall
    fw.options.put(enable=1)  # the control plane accepts nothing new (policy_in DROP)
    _cycle(admin)
    r = _run(sim_thread, guests, worker, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1
    assert r.err.endswith("error execution phase preflight: couldn't validate the identity of the API Server: Get "
                          f"\"https://{EP}/api/v1/namespaces/kube-public/configmaps/cluster-info?timeout=10s\": "
                          f"dial tcp {EP}: i/o timeout\n"), r.err
    fw.rules.post(type="in", action="REJECT", proto="tcp", dport="6443", enable=1)
    _cycle(admin)
    r = _run(sim_thread, guests, worker, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and r.err.endswith(f"dial tcp {EP}: connect: connection refused\n"), r.err
    fw.rules(0).put(action="ACCEPT")
    _cycle(admin)
    r = _run(sim_thread, guests, worker, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 0, r.err
    # a second control plane also needs etcd on the first (client 2379, peer 2380)
    r = _run(sim_thread, guests, cp2, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 1 and "error execution phase control-plane-join/etcd: error creating local etcd static pod " \
        "manifest file: timeout waiting for etcd cluster to be available\n" in r.err, r.err
    assert "cp-1" not in kubeadm.clusters(guests)[EP]["nodes"]
    fw.rules.post(type="in", action="ACCEPT", proto="tcp", dport="2379:2380", source="203.0.113.163", enable=1)
    _cycle(admin)
    r = _run(sim_thread, guests, cp2, "kubeadm", "join", "--config", "/etc/z9/kubeadm.yaml")
    assert r.exitcode == 0, r.err
    assert set(kubeadm.clusters(guests)[EP]["nodes"]) == {"cp-0", "w-0", "cp-1"}
    # a worker whose kubelet can no longer reach the API server: its node goes Unknown
    ready = _nodes(sim_thread, guests, cp)
    assert ready == {"cp-0": "True", "w-0": "True", "cp-1": "True"}
    fw.rules.post(type="in", action="DROP", proto="tcp", dport="6443", source="203.0.113.162", enable=1)
    _cycle(admin)
    assert _nodes(sim_thread, guests, cp) == {"cp-0": "True", "w-0": "Unknown", "cp-1": "True"}


def _nodes(sim_thread, guests, cp) -> dict[str, str]:
    import json

    out = _run(sim_thread, guests, cp, "kubectl", "--kubeconfig", kubeadm.ADMIN_CONF, "get", "nodes", "-o", "json").out
    return {n["metadata"]["name"]: n["status"]["conditions"][0]["status"] for n in json.loads(out)["items"]}
