"""The lease's local deadline (z9.executor.lease_deadline): from the claim's expiry and each
renewal, checked at the last moment before a request leaves, with the attempt's fencing token."""
from __future__ import annotations

import contextvars
from datetime import timedelta

import pytest
import requests
from z9.common.clock import TestClock
from z9.common.errors import LeaseLost
from z9.common.settings import Settings
from z9.executor import lease_deadline
from z9.executor.lease_deadline import (
    HEADER,
    LeaseDeadline,
    LeaseExpired,
    LeaseHeaderAdapter,
)


def _deadline(clock: TestClock, expires_in: float | None = 30.0) -> LeaseDeadline:
    expires = clock.now() + timedelta(seconds=expires_in) if expires_in is not None else None
    return LeaseDeadline("job_1", 3, "host:1:ab", ttl_s=30.0, margin_s=6.0, clock=clock, expires_at=expires)


def test_the_deadline_is_the_ttl_less_the_margin_and_each_renewal_moves_it() -> None:
    clock = TestClock()
    clock.pin()
    d = _deadline(clock)
    assert d.left_s() == pytest.approx(24.0)
    clock.step(23.9)
    d.check("a call")  # still inside
    sent_at = clock.monotonic()
    d.renewed(sent_at)
    assert d.left_s() == pytest.approx(24.0)
    clock.step(24.1)
    with pytest.raises(LeaseExpired) as e:
        d.check("POST /nodes/{node}/qemu/{vmid}/status/start")
    assert isinstance(e.value, LeaseLost)  # the runner abandons the attempt and writes nothing
    assert "host:1:ab (attempt 3)" in str(e.value) and "status/start" in str(e.value)


def test_a_claim_that_expires_sooner_than_a_fresh_ttl_keeps_its_own_expiry() -> None:
    """Stopped between the claim and the attempt's start: the time it has left, not a new TTL."""
    clock = TestClock()
    clock.pin()
    d = _deadline(clock, expires_in=8.0)
    assert d.left_s() == pytest.approx(2.0)
    assert _deadline(clock, expires_in=None).left_s() == pytest.approx(24.0)
    # a renewal sent earlier than the deadline already known never shortens it
    d.renewed(clock.monotonic() - 100)
    assert d.left_s() == pytest.approx(2.0)


class _Sent(Exception):
    pass


def _send(adapter: LeaseHeaderAdapter, ctx: contextvars.Context) -> requests.PreparedRequest:
    req = requests.Request("POST", "https://pve.invalid:8006/api2/json/nodes/pve1/qemu/100/status/start").prepare()
    sent: list[requests.PreparedRequest] = []

    def base_send(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent.append(request)
        raise _Sent()

    orig = requests.adapters.HTTPAdapter.send
    requests.adapters.HTTPAdapter.send = base_send  # type: ignore[method-assign]
    try:
        with pytest.raises((_Sent, LeaseExpired)):
            ctx.run(adapter.send, req)
    finally:
        requests.adapters.HTTPAdapter.send = orig  # type: ignore[method-assign]
    return sent[0] if sent else None  # type: ignore[return-value]


def test_the_adapter_sends_the_fencing_token_and_nothing_after_the_deadline() -> None:
    clock = TestClock()
    clock.pin()
    d = _deadline(clock)
    adapter = LeaseHeaderAdapter()
    # for no job (the shared snapshot): sent, without a token
    plain = _send(adapter, contextvars.copy_context())
    assert plain is not None and HEADER not in plain.headers

    def bound() -> contextvars.Context:
        ctx = contextvars.copy_context()
        ctx.run(lease_deadline.bind, d)
        return ctx

    sent = _send(adapter, bound())
    assert sent is not None and sent.headers[HEADER] == "job_1/3/host:1:ab"
    clock.step(24.5)
    assert _send(adapter, bound()) is None  # refused before it left
    ctx = bound()
    with pytest.raises(LeaseExpired):
        ctx.run(lease_deadline.check, "GET /cluster/resources")

    def unbound_check() -> None:
        with lease_deadline.unbound():
            lease_deadline.check("GET /cluster/resources")  # a read for no job: not refused

    ctx.run(unbound_check)


def test_the_margin_leaves_room_for_the_heartbeat() -> None:
    assert Settings().lease_safety_margin_s == pytest.approx(6.0)
    with pytest.raises(ValueError, match="Z9_LEASE_SAFETY_MARGIN"):
        Settings(lease_ttl_s=10, heartbeat_s=5, lease_safety_margin=0.5)
