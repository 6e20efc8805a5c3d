"""What z9 renders for load balancer appliances, judged by the real tools: every shape the API
accepts gives an haproxy.cfg that Debian's ``haproxy -c`` accepts and keepalived files that
``keepalived -t`` accepts on the interface the appliance really has (``ens18`` here: keepalived runs
in a network namespace holding only that NIC, with the appliance's address). Render level (the
binaries run directly); the same through the simulated appliance: tests/test_lb_appliance_strict.py.
"""
from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck as HypothesisHealthCheck
from hypothesis import assume, given, settings, strategies as st
from pydantic import SecretStr, ValidationError

from z9.api.load_balancers import MAX_SERVICES, MAX_TARGETS, STATUS_CODE, HttpCheck, LoadBalancerCreate
from z9.common.models import LoadBalancer
from z9.executor.jobs import _lb
from z9.sim.appliance import run_tool

from tests.guest_tools import require_guest_tools

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)
ADDRESSES = {"vip": {"ip": "203.0.113.10", "prefix": 24}, "lb-0": {"ip": "203.0.113.11", "prefix": 24},
             "lb-1": {"ip": "203.0.113.12", "prefix": 24}}
SETTINGS = SimpleNamespace(installation_key=SecretStr("ejl0ZXN0LWluc3RhbGxhdGlvbi1rZXktMzJieXRlcyE"), regions={})
PATH_RE = HttpCheck.model_fields["path"].metadata[0].pattern


@pytest.fixture(autouse=True, scope="module")
def tools() -> None:
    require_guest_tools()


def _row(body: dict[str, Any]) -> LoadBalancer:
    """The row the API writes for an accepted ``POST /v1/load-balancers`` body."""
    spec = LoadBalancerCreate.model_validate(body)
    return LoadBalancer(id="lb_01jd3x5v8q2m6n4p7r9s1t3w5y", tenant_id="ten_x", region="dev-1", name=spec.name,
                        type=spec.type, algorithm=spec.algorithm, services=[s.normalized() for s in spec.services],
                        targets=[t.normalized() for t in spec.targets], addresses=ADDRESSES, config_hash=None,
                        config_version=1, status="active", status_reason=None, status_before_delete=None,
                        delete_after=None, health="unknown", health_detail=None, health_at=None, observed=None,
                        observed_at=None, created_at=NOW, updated_at=NOW, deleted_at=None)


def _servers(lb: LoadBalancer) -> dict[str, dict[str, Any]]:
    """What z9 knows of the target servers: running with an address, stopped, deleted, addressless."""
    out = {}
    for i, t in enumerate(t for t in lb.targets if t["type"] == "server"):
        out[t["server_id"]] = [{"status": "running", "power_state": "running", "ip": f"198.51.100.{i % 250 + 1}"},
                               {"status": "stopped", "power_state": "stopped", "ip": f"198.51.100.{i % 250 + 1}"},
                               {"status": "deleted", "power_state": None, "ip": None},
                               {"status": "running", "power_state": "running", "ip": None}][i % 4]
    return out


def judge(lb: LoadBalancer, nic: str = "ens18") -> None:
    """haproxy -c on the rendered file; keepalived -t on each member's, on an appliance whose NIC
    is ``nic`` carrying the member's address."""
    text = _lb.render_haproxy(lb, _lb.resolve_targets(lb, _servers(lb)))
    code, out, err = run_tool("haproxy", ["-c", "-f", "{file}"], "/etc/haproxy/haproxy.cfg.new", text.encode())
    assert code == 0, f"haproxy -c refused what z9 rendered:\n{err or out}\n{text}"
    key = _lb.vrrp_key(SETTINGS, lb)
    for m in lb.members:
        conf = _lb.render_keepalived(lb, m, nic, key)
        ifaces = [(nic, [f"{ADDRESSES[m]['ip']}/24"])]
        code, out, err = run_tool("keepalived", ["-t", "-f", "{file}"], "/etc/keepalived/keepalived.conf.new",
                                  conf.encode(), ifaces)
        assert code == 0, f"keepalived -t refused what z9 rendered for {m}:\n{err or out}\n{conf}"


def _service(port: int, protocol: str = "http", proxy: bool = True, check: str = "http") -> dict[str, Any]:
    hc: dict[str, Any] = {"protocol": check, "port": 8000 + port % 1000, "interval_s": 5, "timeout_s": 2, "retries": 3}
    if check == "http":
        hc["http"] = {"path": "/healthz?probe=1&x=%20", "status_codes": ["200", "2??", "30?", "404"]}
    return {"protocol": protocol, "listen_port": port, "destination_port": 8080, "proxyprotocol": proxy,
            "health_check": hc}


def test_the_harness_refuses_what_a_real_appliance_would() -> None:
    """The judge can fail: what lb-small rendered before (a unicast source without peers) and a
    file naming eth0 on an ens18 appliance are refused, as keepalived refuses them on a real one."""
    old_small = ("vrrp_instance z9 {\n    state BACKUP\n    nopreempt\n    interface ens18\n    virtual_router_id 9\n"
                 "    priority 100\n    advert_int 1\n    unicast_src_ip 203.0.113.11\n    unicast_peer {\n    }\n"
                 "    virtual_ipaddress {\n        203.0.113.10/24 dev ens18\n    }\n}\n")
    code, _, err = run_tool("keepalived", ["-t", "-f", "{file}"], "/k.conf", old_small.encode(),
                            [("ens18", ["203.0.113.11/24"])])
    assert code != 0 and "without any unicast peers" in err, err
    lb = _row({"name": "web", "region": "dev-1", "type": "lb-ha", "services": [_service(80)]})
    with pytest.raises(AssertionError, match="interface eth0 for vrrp_instance z9 doesn't exist"):
        keyed = _lb.render_keepalived(lb, "lb-0", "eth0", "k3y-0123")
        code, out, err = run_tool("keepalived", ["-t", "-f", "{file}"], "/k.conf", keyed.encode(),
                                  [("ens18", ["203.0.113.11/24"])])
        assert code == 0, err


@pytest.mark.parametrize("kind", ["lb-small", "lb-ha"])
@pytest.mark.parametrize("algorithm", ["round_robin", "least_connections"])
def test_the_largest_shape_passes_both_tools(kind: str, algorithm: str) -> None:
    """16 services (tcp and http, http checks with paths and codes, proxy protocol on and off, a
    check on another port), 500 targets (servers in every state z9 knows, and IPs)."""
    services = [_service(80 + i, protocol=("http", "tcp")[i % 2], proxy=bool(i % 3), check=("http", "tcp")[i % 2])
                for i in range(MAX_SERVICES)]
    services[0]["health_check"]["port"] = services[0]["destination_port"]   # check-send-proxy on the service port
    targets = [{"type": "server", "server_id": f"srv_{i:026d}"} for i in range(MAX_TARGETS // 2)]
    targets += [{"type": "ip", "ip": f"192.0.2.{i % 250 + 1}"} for i in range(250)][:MAX_TARGETS - len(targets)]
    targets = [t if t["type"] == "server" else {"type": "ip", "ip": f"198.18.{i // 250}.{i % 250 + 1}"}
               for i, t in enumerate(targets)]
    judge(_row({"name": "big", "region": "dev-1", "type": kind, "algorithm": algorithm, "services": services,
                "targets": targets}))


def test_no_services_and_no_targets_pass_both_tools() -> None:
    for kind in ("lb-small", "lb-ha"):
        judge(_row({"name": "empty", "region": "dev-1", "type": kind}))
        judge(_row({"name": "one", "region": "dev-1", "type": kind, "services": [_service(443, "tcp", False, "tcp")]}))


health_checks = st.one_of(
    st.none(),
    st.builds(lambda port, i, t, r: {"protocol": "tcp", "port": port, "interval_s": i, "timeout_s": min(t, i),
                                     "retries": r},
              st.integers(1, 65535), st.integers(3, 300), st.integers(1, 300), st.integers(1, 10)),
    st.builds(lambda port, i, t, r, path, codes: {"protocol": "http", "port": port, "interval_s": i,
                                                  "timeout_s": min(t, i), "retries": r,
                                                  "http": {"path": path, "status_codes": codes}},
              st.integers(1, 65535), st.integers(3, 300), st.integers(1, 300), st.integers(1, 10),
              st.from_regex(PATH_RE, fullmatch=True), st.lists(st.from_regex(STATUS_CODE, fullmatch=True),
                                                               min_size=1, max_size=8)))
services = st.lists(st.fixed_dictionaries({
    "protocol": st.sampled_from(["tcp", "http"]), "listen_port": st.integers(1, 65535),
    "destination_port": st.integers(1, 65535), "proxyprotocol": st.booleans(), "health_check": health_checks}),
    min_size=1, max_size=MAX_SERVICES, unique_by=lambda s: s["listen_port"])
targets = st.lists(st.one_of(
    st.builds(lambda n: {"type": "server", "server_id": f"srv_{n:026d}"}, st.integers(0, 10 ** 6)),
    st.builds(lambda a, b: {"type": "ip", "ip": f"{a}.{b // 256}.{b % 256}.{b % 250 + 1}"},
              st.sampled_from([1, 8, 45, 100, 192, 198, 203, 223]), st.integers(0, 65535))),
    max_size=40, unique_by=lambda t: t.get("server_id") or t.get("ip"))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HypothesisHealthCheck))
@given(kind=st.sampled_from(["lb-small", "lb-ha"]), algorithm=st.sampled_from(["round_robin", "least_connections"]),
       services=services, targets=targets, nic=st.sampled_from(["ens18", "eth0", "enp0s18"]))
def test_every_shape_the_api_accepts_passes_both_tools(kind: str, algorithm: str, services: list, targets: list,
                                                       nic: str) -> None:
    body = {"name": "gen", "region": "dev-1", "type": kind, "algorithm": algorithm, "services": services,
            "targets": targets}
    try:
        lb = _row(body)
    except ValidationError:
        assume(False)  # not a shape the API accepts
        return
    judge(lb, nic)


PAIR = r"""
set -e
mount -t tmpfs none /run && mkdir -p /run/netns && ip netns add b
ip link add ens18 type veth peer name ens18b && ip link set ens18b netns b
ip netns exec b ip link set ens18b name ens18
ip addr add 203.0.113.11/24 dev ens18 && ip link set ens18 up && ip link set lo up
ip netns exec b sh -c 'ip addr add 203.0.113.12/24 dev ens18 && ip link set ens18 up && ip link set lo up'
set +e
trap 'for p in /run/*.pid; do kill $(cat $p) 2>/dev/null; done; sleep 0.5' EXIT
holds() { if [ $1 = a ]; then ip -br addr show ens18; else ip netns exec b ip -br addr show ens18; fi \
          | grep -q ' 203.0.113.10/24'; }
state() { a=0; b=0; holds a && a=1; holds b && b=1; echo "$a$b"; }
until_state() { for i in $(seq 1 120); do [ "$(state)" = "$1" ] && break; sleep 0.1; done; echo "$2 $(state)"; }
start() { if [ $1 = a ]; then keepalived -n -l -D -f "$DIR/$2" -p /run/a.pid -r /run/a-v.pid >>"$DIR/a.log" 2>&1 &
          else ip netns exec b keepalived -n -l -D -f "$DIR/$2" -p /run/b.pid -r /run/b-v.pid >>"$DIR/b.log" 2>&1 &
          fi; }
stop() { kill $(cat /run/$1.pid); for i in $(seq 1 50); do [ -e /run/$1.pid ] || break; sleep 0.1; done; }
start a lb-0.conf; sleep 1; start b lb-1.conf
until_state 10 start
stop a
until_state 01 failover
start a lb-0.conf; sleep 6
echo "returned $(state)"
stop a; stop b
start a lb-0.conf; start b other-key.conf; sleep 6
echo "forged $(state)"
"""


def test_the_rendered_pair_elects_one_holder_keeps_it_after_a_failover_and_drops_other_keys(tmp_path) -> None:
    """The two real keepalived daemons with z9's files, each in a network namespace of its own
    joined by a veth pair named ens18 (the appliances' NIC): exactly one holds the VIP; when it
    stops the other takes it; when it returns it does not take it back (nopreempt, the chosen
    behaviour); an appliance with another key (a forged or stale advert) is not accepted as a
    peer (IPSEC-AH): both hold the VIP, which z9's verify reports."""
    import shutil
    import subprocess
    lb = _row({"name": "pair", "region": "dev-1", "type": "lb-ha", "services": [_service(80)]})
    key = _lb.vrrp_key(SETTINGS, lb)
    for m in lb.members:
        (tmp_path / f"{m}.conf").write_text(_lb.render_keepalived(lb, m, "ens18", key))
    (tmp_path / "other-key.conf").write_text(_lb.render_keepalived(lb, "lb-1", "ens18", "0ther-k3"))
    p = subprocess.run([shutil.which("unshare") or "unshare", "-rnm", "--propagation", "private", "sh", "-c", PAIR],
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DIR": str(tmp_path)}, capture_output=True,
                       text=True, timeout=90)
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines() if " " in line)
    logs = "\n".join((tmp_path / f).read_text() for f in ("a.log", "b.log") if (tmp_path / f).exists())
    assert lines.get("start") == "10", (p.stdout, p.stderr, logs[-3000:])        # lb-0 (started first) holds it
    assert lines.get("failover") == "01", (p.stdout, logs[-3000:])               # lb-1 took it
    assert lines.get("returned") == "01", (p.stdout, logs[-3000:])               # and keeps it: nopreempt
    assert lines.get("forged") == "11", (p.stdout, logs[-3000:])                 # another key is no peer
    assert "invalid IPSEC HMAC-MD5 value" in logs
