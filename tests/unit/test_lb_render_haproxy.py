"""The rendered HAProxy file (pure): what HAProxy does with it, not only that it parses."""
from __future__ import annotations

from types import SimpleNamespace

from z9.resources.load_balancer.jobs.shared import render_haproxy


def _lb(**service):
    svc = {"protocol": "tcp", "listen_port": 80, "destination_port": 8080, "proxyprotocol": True,
           "health_check": {"protocol": "tcp", "port": 8080, "interval_s": 15, "timeout_s": 10, "retries": 3,
                            "http": None}, **service}
    return SimpleNamespace(id="lb_x", name="x", algorithm="round_robin", services=[svc])


TARGET = [{"key": "ip:192.0.2.10", "addr": "192.0.2.10"}]


def test_proxyprotocol_health_checks_speak_proxy_on_the_service_port() -> None:
    """HAProxy sends the PROXY header on health checks only when the server line has no ``port``
    (its send-proxy doc); z9 always writes ``check port N``, so a target whose listener expects
    PROXY got checks without it and was marked DOWN. ``check-send-proxy`` when the check goes to
    the destination port (the same listener); not when it probes another port."""
    line = next(x for x in render_haproxy(_lb(), TARGET).splitlines() if x.strip().startswith("server "))
    assert " send-proxy" in line and "check-send-proxy" in line, line
    other = _lb(health_check={"protocol": "tcp", "port": 9000, "interval_s": 15, "timeout_s": 10, "retries": 3,
                              "http": None})
    line = next(x for x in render_haproxy(other, TARGET).splitlines() if x.strip().startswith("server "))
    assert " send-proxy" in line and "check-send-proxy" not in line, line
    plain = _lb(proxyprotocol=False)
    line = next(x for x in render_haproxy(plain, TARGET).splitlines() if x.strip().startswith("server "))
    assert "send-proxy" not in line, line
