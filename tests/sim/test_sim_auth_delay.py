"""A failed authentication as pveproxy answers it: a bare 401 with its reason, sent after a delay.

pve-http-server ``src/PVE/APIServer/AnyEvent.pm`` (handle_request): when ``auth_handler`` dies (no
ticket, a bad ticket, a bad API token, a bad CSRF token) the answer goes out with ``my $delay = 3``
("always delay unauthorized calls by 3 seconds"); a handler's own 401 (``POST /access/ticket`` with a
wrong password, pve-access-control ``API2/AccessControl.pm`` create_ticket) is delayed by
``3 - tv_interval($reqstate->{starttime})`` in handle_api2_request. The tests' simulator runs with
``auth_delay_s: 0`` (passed explicitly); ``z9 sim`` and a ``SimConfig()`` default to PVE's 3 s.
"""

from __future__ import annotations

import time

import pytest
import requests
from proxmoxer import AuthenticationError, ProxmoxAPI, ResourceException

from z9.sim.server import SimConfig

DELAY = 0.4  # a short stand-in for PVE's 3 s: the test measures that the simulator waits it


def test_pves_delay_is_the_default_of_sim_config_and_z9_sim():
    import argparse
    from unittest import mock

    assert SimConfig().auth_delay_s == 3.0
    from z9.sim import server
    seen: dict = {}

    def parse_only(self, argv=None):  # z9 sim's parser, without starting a simulator
        ns = orig(self, argv)
        seen.update(vars(ns))
        raise SystemExit(0)
    orig = argparse.ArgumentParser.parse_args
    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_only), pytest.raises(SystemExit):
        server.main([])
    assert seen["auth_delay_s"] == 3.0


@pytest.fixture
def delayed(sim, admin):
    admin("put", "/config", json={"auth_delay_s": DELAY})
    yield sim
    admin("put", "/config", json={"auth_delay_s": 0})  # /_sim/reset keeps it: put the tests' 0 back


def _timed(call):
    t0 = time.monotonic()
    out = call()
    return out, time.monotonic() - t0


def test_a_bad_api_token_is_answered_after_the_delay_with_an_empty_body(delayed):
    bad = ProxmoxAPI("127.0.0.1", port=delayed.port, user="root@pam", token_name="z9", token_value="wrong",
                     verify_ssl=False, timeout=10)
    with pytest.raises(ResourceException) as e:
        t0 = time.monotonic()
        bad.version.get()
    took = time.monotonic() - t0
    assert e.value.status_code == 401 and e.value.content == "Authentication failed!"  # the reason phrase
    assert e.value.errors == {"errors": b""}  # proxmoxer found no body
    assert took >= DELAY
    r, took = _timed(lambda: requests.get(f"{delayed.url}/api2/json/version", verify=False, timeout=10))
    assert (r.status_code, r.reason, r.content) == (401, "No ticket", b"") and took >= DELAY


def test_a_wrong_password_for_a_ticket_is_answered_after_the_delay(delayed):
    t0 = time.monotonic()
    with pytest.raises(AuthenticationError):
        ProxmoxAPI("127.0.0.1", port=delayed.port, user="root@pam", password="wrong", verify_ssl=False, timeout=10)
    assert time.monotonic() - t0 >= DELAY


LONG_DELAY = 60.0  # longer than the requests' timeout below: a delayed answer could not arrive in time


@pytest.fixture
def long_delayed(sim, admin):
    admin("put", "/config", json={"auth_delay_s": LONG_DELAY})
    yield sim
    admin("put", "/config", json={"auth_delay_s": 0})


def test_a_good_request_is_not_delayed(long_delayed, pve):
    # No time measured (a loaded machine makes any bound flaky): with a delay far longer than the
    # client's timeout, a good request that was delayed would time out instead of answering.
    assert pve.version.get()["version"]
    api = ProxmoxAPI("127.0.0.1", port=long_delayed.port, user="root@pam", password=long_delayed.config.password,
                     verify_ssl=False, timeout=10)
    assert api.version.get()["version"]
