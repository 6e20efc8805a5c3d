"""The simulator's appliance model (z9.sim.appliance): HAProxy's grammar subset and keepalived's."""
from __future__ import annotations

from z9.sim.appliance import parse_haproxy, parse_keepalived

GOOD = """global
    stats socket /run/haproxy/admin.sock mode 660 level admin
defaults
    timeout connect 5s
frontend svc-80
    bind :80
    mode tcp
    default_backend svc-80
backend svc-80
    mode tcp
    balance roundrobin
    server srv_a 203.0.113.10:8080 check port 8080
"""


def test_a_valid_config_has_no_alerts_and_a_frontend_may_share_a_backends_name() -> None:
    alerts, model = parse_haproxy(GOOD)
    assert alerts == []
    assert model["backends"]["svc-80"]["servers"] == [("srv_a", "203.0.113.10", 8080, 8080)]


def test_duplicate_binds_missing_backends_and_bad_lines_are_alerts() -> None:
    text = GOOD + "frontend other\n    bind :80\n    default_backend nowhere\n"
    alerts, _ = parse_haproxy(text)
    assert any("bind :80 is already used" in a for a in alerts)
    assert any("unable to find required default_backend: 'nowhere'" in a for a in alerts)
    alerts, _ = parse_haproxy("bind :80\n")
    assert any("out of section" in a for a in alerts)
    alerts, _ = parse_haproxy(GOOD + "backend svc-80\n")
    assert any("same name as another proxy" in a for a in alerts)
    alerts, _ = parse_haproxy(GOOD.replace("roundrobin", "fastest"))
    assert any("unknown balance algorithm 'fastest'" in a for a in alerts)
    alerts, _ = parse_haproxy(GOOD + "    server srv_a 203.0.113.11:8080\n")
    assert any("server 'srv_a' already defined" in a for a in alerts)


def test_keepalived_nopreempt_needs_backup_and_a_router_id() -> None:
    conf = ("vrrp_instance z9 {\n state BACKUP\n nopreempt\n virtual_router_id 7\n priority 100\n"
            " unicast_peer {\n 203.0.113.12\n }\n virtual_ipaddress {\n 203.0.113.10/24 dev eth0\n }\n}\n")
    alerts, k = parse_keepalived(conf)
    assert alerts == [] and k["vips"] == ["203.0.113.10/24"] and k["peers"] == ["203.0.113.12"]
    alerts, _ = parse_keepalived(conf.replace("state BACKUP", "state MASTER"))
    assert alerts == ["(z9) nopreempt requires state BACKUP"]
    alerts, _ = parse_keepalived(conf.replace(" virtual_router_id 7\n", ""))
    assert alerts
