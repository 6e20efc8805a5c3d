"""Load balancer rendering and health (pure: resources/z9/resources/load_balancer/jobs/shared.py)."""
from __future__ import annotations

from datetime import datetime, timezone

from z9.resources.load_balancer.model import LoadBalancer
from z9.resources.load_balancer.jobs import shared as _lb
from z9.sim.appliance import parse_haproxy, parse_keepalived

NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _lb_row(**over) -> LoadBalancer:
    base = dict(id="lb_01jd3x5v8q2m6n4p7r9s1t3w5y", tenant_id="ten_x", region="dev-1", name="web", type="lb-ha",
                algorithm="round_robin",
                services=[{"protocol": "http", "listen_port": 80, "destination_port": 8080, "proxyprotocol": False,
                           "health_check": {"protocol": "http", "port": 8080, "interval_s": 5, "timeout_s": 2,
                                            "retries": 3, "http": {"path": "/healthz", "status_codes": ["2??"]}}}],
                targets=[{"type": "server", "server_id": "srv_b"}, {"type": "ip", "ip": "203.0.113.99"},
                         {"type": "server", "server_id": "srv_a"}],
                addresses={"vip": {"ip": "203.0.113.10", "prefix": 24}, "lb-0": {"ip": "203.0.113.11", "prefix": 24},
                           "lb-1": {"ip": "203.0.113.12", "prefix": 24}},
                config_hash=None, config_version=1, status="active", status_reason=None, status_before_delete=None,
                delete_after=None, health="unknown", health_detail=None, health_at=None, observed=None,
                observed_at=None, created_at=NOW, updated_at=NOW, deleted_at=None)
    base.update(over)
    return LoadBalancer(**base)


SERVERS = {"srv_a": {"status": "running", "power_state": "running", "ip": "203.0.113.20"},
           "srv_b": {"status": "deleted", "power_state": None, "ip": None}}


def test_rendering_is_deterministic_valid_and_leaves_deleted_servers_out() -> None:
    lb = _lb_row()
    targets = _lb.resolve_targets(lb, SERVERS)
    text = _lb.render_haproxy(lb, targets)
    again = _lb.render_haproxy(_lb_row(targets=list(reversed(lb.targets))), _lb.resolve_targets(lb, SERVERS))
    assert text == again                                  # target order does not matter
    model = parse_haproxy(text)                           # (haproxy -c: tests/integration/load_balancers/test_lb_guest_tools.py)
    names = [s[0] for s in model["backends"]["svc-80"]["servers"]]
    assert names == ["ip-203.0.113.99", "srv_a"]          # srv_b (deleted) is not rendered
    assert "option httpchk GET /healthz" in text and "http-check expect rstatus ^(2[0-9][0-9])$" in text
    assert _lb.sha256(text) != _lb.sha256(_lb.render_haproxy(_lb_row(algorithm="least_connections"), targets))


def test_keepalived_is_unicast_backup_nopreempt_towards_the_peer_authenticated() -> None:
    """lb-ha: unicast VRRP to the other appliance on the interface given (the guest's), both BACKUP
    with nopreempt, IPSEC-AH with the load balancer's key; lb-small: the VIP as a static address
    (no VRRP at all). (keepalived -t: tests/integration/load_balancers/test_lb_guest_tools.py.)"""
    lb = _lb_row()
    k0 = parse_keepalived(_lb.render_keepalived(lb, "lb-0", "ens18", "k3y-0123"))["instances"]
    k1 = parse_keepalived(_lb.render_keepalived(lb, "lb-1", "ens19", "k3y-0123"))["instances"]
    assert len(k0) == len(k1) == 1
    k0, k1 = k0[0], k1[0]
    assert k0["state"] == k1["state"] == "BACKUP" and k0["nopreempt"] and k1["nopreempt"]
    assert k0["peers"] == ["203.0.113.12"] and k1["peers"] == ["203.0.113.11"]
    assert k0["src"] == "203.0.113.11" and k1["src"] == "203.0.113.12"
    assert k0["interface"] == "ens18" and k1["interface"] == "ens19"
    assert k0["vips"] == [("203.0.113.10/24", "ens18")] and k1["vips"] == [("203.0.113.10/24", "ens19")]
    assert k0["vrid"] == k1["vrid"] and k0["priority"] > k1["priority"]
    assert k0["auth"] == k1["auth"] == ("AH", "k3y-0123")
    small = parse_keepalived(_lb.render_keepalived(_lb_row(type="lb-small"), "lb-0", "ens18", "k3y-0123"))
    assert small == {"static": [("203.0.113.10/24", "ens18")], "instances": []}
    assert "k3y-0123" not in _lb.render_keepalived(_lb_row(type="lb-small"), "lb-0", "ens18", "k3y-0123")


def test_the_vrrp_key_is_per_load_balancer_and_derived_from_the_installation_key() -> None:
    from pydantic import SecretStr
    from types import SimpleNamespace
    a = SimpleNamespace(installation_key=SecretStr("A" * 43), regions={})
    b = SimpleNamespace(installation_key=SecretStr("B" * 43), regions={})
    k = _lb.vrrp_key(a, _lb_row())
    assert len(k) == 8 and k == _lb.vrrp_key(a, _lb_row())                     # stable: both appliances agree
    assert k != _lb.vrrp_key(a, _lb_row(id="lb_01jd3x5v8q2m6n4p7r9s1t3w5z"))   # per load balancer
    assert k != _lb.vrrp_key(b, _lb_row())                                     # per installation
    assert "#" not in k and "!" not in k and " " not in k                      # no keepalived comment/space


def test_appliance_vm_names_are_dns_labels_whatever_the_name_length() -> None:
    """PVE's ``name`` is a DNS name: ``<lb name>-lb-N`` cut to 63 characters once ended in ``-``
    (an LB name of 59-62 characters) or made both members' names equal."""
    import re
    label = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    for n in range(1, 64):
        name = ("a" * (n - 1) + "b") if n % 2 else ("ab-" * 30)[:n - 1] + "c"
        got = [_lb.vm_name(name, m) for m in ("lb-0", "lb-1")]
        assert all(label.match(g) for g in got) and got[0] != got[1], (n, got)
        assert got[0].endswith("-lb-0") and got[1].endswith("-lb-1")
    assert _lb.vm_name("web", "lb-0") == "web-lb-0"


def test_health_joins_haproxy_with_what_only_z9_knows() -> None:
    lb = _lb_row()
    servers = {**SERVERS, "srv_a": {"status": "stopped", "power_state": "stopped", "ip": "203.0.113.20"}}
    targets = _lb.resolve_targets(lb, servers)
    stat = {("svc-80", "ip-203.0.113.99"): {"status": "UP", "check_status": "L7OK"},
            ("svc-80", "srv_a"): {"status": "DOWN", "check_status": "L4CON"}}
    overall, detail = _lb.health(lb, targets, stat)
    t = detail["targets"]
    assert t["server:srv_a"] == [{"listen_port": 80, "status": "unhealthy", "reason": "server_stopped"}]
    assert t["server:srv_b"] == [{"listen_port": 80, "status": "unused", "reason": "server_deleted"}]
    assert t["ip:203.0.113.99"] == [{"listen_port": 80, "status": "healthy", "reason": "ok"}]
    assert overall == "degraded"
    stat[("svc-80", "ip-203.0.113.99")] = {"status": "DOWN", "check_status": "L7STS"}
    overall, detail = _lb.health(lb, targets, stat)
    assert overall == "unhealthy"
    assert detail["targets"]["ip:203.0.113.99"][0]["reason"] == "response_code_mismatch"
    assert _lb.health(lb, targets, None)[1]["targets"]["ip:203.0.113.99"][0]["reason"] == "no_appliance"
    assert _lb.health(_lb_row(targets=[]), [], stat)[0] == "unknown"


def test_a_server_without_address_is_rendered_out_and_unused() -> None:
    """A target server whose primary IPv4 went (unassigned): not in the file, ``unused``/``no_address``;
    a stopped one stays in the file (its address is still its own) and is ``server_stopped``."""
    lb = _lb_row(targets=[{"type": "server", "server_id": "srv_a"}, {"type": "server", "server_id": "srv_c"}])
    servers = {"srv_a": {"status": "running", "power_state": "running", "ip": None},
               "srv_c": {"status": "stopped", "power_state": "stopped", "ip": "203.0.113.21"}}
    targets = _lb.resolve_targets(lb, servers)
    text = _lb.render_haproxy(lb, targets)
    assert "srv_a" not in text and "server srv_c 203.0.113.21:8080" in text
    overall, detail = _lb.health(lb, targets, {("svc-80", "srv_c"): {"status": "UP", "check_status": "L4OK"}})
    assert detail["targets"]["server:srv_a"] == [{"listen_port": 80, "status": "unused", "reason": "no_address"}]
    assert detail["targets"]["server:srv_c"] == [{"listen_port": 80, "status": "unhealthy", "reason": "server_stopped"}]
    assert overall == "unhealthy"


def test_missing_guest_tools_skip_or_fail_as_ci_asks(monkeypatch) -> None:
    import pytest

    from tests import guest_tools
    monkeypatch.setattr(guest_tools, "tools_missing", lambda: ["haproxy"])
    monkeypatch.delenv("Z9_REQUIRE_GUEST_TOOLS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="haproxy"):
        guest_tools.require_guest_tools()
    monkeypatch.setenv("Z9_REQUIRE_GUEST_TOOLS", "1")
    with pytest.raises(pytest.fail.Exception, match="Z9_REQUIRE_GUEST_TOOLS=1"):
        guest_tools.require_guest_tools()
