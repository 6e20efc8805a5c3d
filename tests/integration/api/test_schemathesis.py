"""Schemathesis over every route of the generated OpenAPI document (issue 12 §3): all of its checks
(`--checks all`), its four phases (examples, coverage, fuzzing, and the stateful phase that follows
the document's links and the ones it infers), against the API served on a real database, with 0
failures.

Reduced by default so it stays under a minute: ``Z9_TEST_SCHEMATHESIS_EXAMPLES`` (default 5) is the
number of examples per operation and phase; set it to 100 (schemathesis' own default) for the long
form, and ``Z9_TEST_SCHEMATHESIS_SEED`` to replay a run (the seed is printed on failure).

The engine is schemathesis' own (what ``st run`` drives), run in a worker thread: its HTTP client is
synchronous and the API answers on this test's event loop."""
from __future__ import annotations

import asyncio
import json
import os
import random
from typing import Any

import pytest

from tests.support import Stack
from z9.resources.load_balancer import RULE_TEXT

# 422s that no schema can foresee: the request is well-formed, but a field names something this
# installation or tenant does not have (a region, image or pool of the settings, a server, job or
# address id), an Idempotency-Key is reused with another request, a disk would shrink, or a rule
# spans fields (a health check's timeout within its interval, unique ports, targets and pool
# names; a changed health check merged with the service's own, which must still hold: `http` on a
# check that stays tcp), or an ip target is the load balancer's own address (its VIP: an IP of a
# response). Schemathesis' `positive_data_acceptance` expects such schema-valid requests to be
# accepted; a 422 whose every detail is one of these is the API's answer, not a mismatch. Anything
# else, and every other check, counts (but see _deletion_only_accepted).
NOT_IN_ANY_SCHEMA = ("unknown region", "unknown image", "unknown pool", "unknown server", "unknown job",
                     "unknown address", "no pool of this family", "reused", "cannot shrink", "already that size",
                     "timeout_s must not exceed interval_s", "two services listen on the same port",
                     "a target is listed twice", "duplicate pool name", "http is only for protocol http",
                     "the load balancer's own address", "above the region's volume_max_gib",
                     # what a load balancer may reach depends on the region's networks and pools and
                     # on who holds an address now (z9.resources.load_balancer); a
                     # kubeconfig's longest life is an installation setting
                     *RULE_TEXT.values(), "past Z9_KUBECONFIG_MAX_EXPIRY_S")

EXAMPLES = int(os.environ.get("Z9_TEST_SCHEMATHESIS_EXAMPLES", "5"))
SEED = int(os.environ.get("Z9_TEST_SCHEMATHESIS_SEED", "0")) or random.randrange(1, 2**31)
# An ssh key the pattern admits is still refused when its blob is no key ssh-keygen reads or its
# comment would break the user-data Proxmox writes (z9.common.sshkeys): no regex checks a blob.
NOT_IN_ANY_SCHEMA += ("not a public key ssh-keygen can read", "its comment holds YAML syntax")
# A network's range without host bits (no regex says it), an address inside the network named (its
# range is the network's), a network id that exists.
NOT_IN_ANY_SCHEMA += ("has host bits set", "unknown network", "not in ", "named twice")
# A firewall rule's fields depend on each other as Hetzner's do (a port for tcp/udp only, sources on an
# in rule, destinations on an out rule), an address is a CIDR (no pattern says it of IPv6), the rules'
# compiled size is a sum, and a rule may name a firewall this tenant does not have
NOT_IN_ANY_SCHEMA += ("required for protocol", "not allowed for protocol", "an in rule needs",
                      "an out rule needs", "not allowed on an in rule", "not allowed on an out rule",
                      "is not a port 1-65535", "is not an IP address or CIDR", "effective rules",
                      "unknown firewall")
# A cluster's version must be one an image of the region carries (the region's kubernetes_images), and a
# named image must carry it: the catalogue is installation data, no schema says it.
NOT_IN_ANY_SCHEMA += ("in this image", "no image of the region carries")


def _spare_the_token_in_use(own_id: str, stand_in_id: str) -> Any:
    """A ``before_call`` hook: a DELETE /tokens/{id} of the token the run authenticates with
    revokes another token of the tenant instead (made for it; a real revocation, answered and
    checked the same). The fuzzing phase learns the token's id from answers (GET /tokens, a job's
    `actor`) and, for some seeds, revoked it: every later request was a 401, which every check
    accepts — the rest of the run tested nothing and passed (seed 1234, 40 examples: 1,800 of
    2,050 requests)."""
    def spare(_ctx: Any, case: Any, _kwargs: Any) -> None:
        if case.operation.method.upper() == "DELETE" and case.operation.path == "/tokens/{id}" \
                and (case.path_parameters or {}).get("id") == own_id:
            case.path_parameters["id"] = stand_in_id
    return spare


def _run(doc: dict[str, Any], base_url: str, token: str, spare: Any) -> tuple[list[str], dict[str, int]]:
    """Run schemathesis' engine over ``doc``; the failures (one text each) and how many scenarios
    each phase ran. ``spare``: the hook of :func:`_spare_the_token_in_use`."""
    import schemathesis
    from schemathesis.config import SchemathesisConfig
    from schemathesis.engine import Status, events, from_schema

    from schemathesis.config._checks import (NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES,
                                             POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES)

    # 413 (a body over 256 KiB, documented on every operation with a body) is a rejection too; the
    # schema cannot bound a body's encoded size (32 ssh keys of 16 KiB each are schema-valid)
    config = SchemathesisConfig.from_dict({"checks": {
        "negative_data_rejection": {"expected-statuses": [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]},
        "positive_data_acceptance": {"expected-statuses": [*POSITIVE_DATA_ACCEPTANCE_EXPECTED_STATUSES, "413"]}}})
    config.update(seed=SEED, max_failures=None)
    project = config.projects.override
    project.update(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, request_timeout=30)
    project.checks.update(included_check_names=["all"])

    project.phases.update(phases=["examples", "coverage", "fuzzing", "stateful"])
    project.generation.update(max_examples=EXAMPLES, database="none")  # no .hypothesis/ in the tree
    schema = schemathesis.openapi.from_dict(doc, config=config)

    def short_waits(_ctx: Any, case: Any, _kwargs: Any) -> None:
        # Nothing runs the jobs here: a valid `wait_s` would hold each request for its whole
        # wait (up to 60 s). Valid waits are sent as 1 s (tests/integration/api/test_waiting.py proves the long-poll);
        # invalid ones as generated.
        wait = (case.query or {}).get("wait_s")
        if isinstance(wait, (int, str)) and not isinstance(wait, bool) and str(wait).isascii() \
                and str(wait).isdigit() and 1 < int(wait) <= 60:
            case.query["wait_s"] = 1

    from schemathesis.hooks import GLOBAL_HOOK_DISPATCHER

    GLOBAL_HOOK_DISPATCHER.register_hook_with_name(short_waits, "before_call")
    GLOBAL_HOOK_DISPATCHER.register_hook_with_name(spare, "before_call")
    failures: list[str] = []
    scenarios: dict[str, int] = {}
    started: dict[str, float] = {}
    requests: dict[str, int] = {}
    transitions: dict[str, int] = {}
    try:
        events_ = list(from_schema(schema).execute())
    finally:
        GLOBAL_HOOK_DISPATCHER.unregister(short_waits)
        GLOBAL_HOOK_DISPATCHER.unregister(spare)
    for event in events_:
        if isinstance(event, events.PhaseStarted):
            started[event.phase.name.value] = event.timestamp
            if event.payload is not None:
                transitions.update(inferred=event.payload.inferred_transitions, total=event.payload.transitions_total,
                                   selected=event.payload.transitions_selected)
        elif isinstance(event, events.PhaseFinished):
            print(f"schemathesis phase {event.phase.name.value}: {event.timestamp - started.get(event.phase.name.value, event.timestamp):.1f} s")
        if isinstance(event, events.ScenarioFinished):
            scenarios[event.phase.value] = scenarios.get(event.phase.value, 0) + 1
            requests[event.phase.value] = requests.get(event.phase.value, 0) + len(event.recorder.interactions)
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    if check.status == Status.FAILURE and check.failure_info is not None:
                        f = check.failure_info.failure
                        inter = event.recorder.interactions.get(case_id)
                        if check.name == "positive_data_acceptance" and _not_in_any_schema(inter):
                            continue
                        if check.name == "use_after_free" and _deletion_only_accepted(event.recorder, f):
                            continue
                        answer = "no answer"
                        if inter is not None and inter.response is not None:
                            answer = f"{inter.response.status_code} {inter.response.content[:300]!r}"
                        failures.append(f"[{event.phase.value}] {event.recorder.label}: {check.name}: {f.title}\n"
                                        f"    {' '.join(f.message.split())}\n    -> {answer}\n"
                                        f"    {check.failure_info.code_sample[:600]}")
        elif isinstance(event, events.NonFatalError):
            failures.append(f"[{event.phase}] {event.label}: error: {event.info.title}: {event.info.message}")
        elif isinstance(event, events.FatalError):
            failures.append(f"fatal: {event.exception!r}")
    print("schemathesis requests per phase:", requests, "stateful transitions:", transitions)
    return failures, scenarios


def _deletion_only_accepted(recorder: Any, failure: Any) -> bool:
    """`use_after_free` takes any 2xx answer to a DELETE for the deletion done, and fails a later
    read of the resource that is not 404. Every DELETE of the API answers 202 Accepted: a
    deletion "accepted for processing, not completed" (RFC 9110 §15.3.3) — two-phase, the
    resource stays, `deleting` and restorable during its buffer (or `destroying` until its final
    job ran; nothing runs jobs here), so reading it is no use after free. True when the DELETE
    the failure names answered 202; a DELETE that answers 200 or 204 still counts."""
    inter = recorder.interactions.get(getattr(failure, "deleted_case_id", None) or "")
    return inter is not None and inter.response is not None and inter.response.status_code == 202


def _not_in_any_schema(inter: Any) -> bool:
    if inter is None or inter.response is None:
        return False
    return _unforeseeable(inter.response.status_code, inter.response.content)


def _unforeseeable(status: int, content: bytes) -> bool:
    """A 422 whose every detail is one of NOT_IN_ANY_SCHEMA."""
    if status != 422:
        return False
    try:
        details = json.loads(content)["error"]["details"]
    except (ValueError, KeyError, TypeError):
        return False
    return bool(details) and all(any(m in str(d.get("message")) for m in NOT_IN_ANY_SCHEMA) for d in details)


@pytest.mark.timeout(600)
async def test_schemathesis_finds_no_failure_on_any_route(api: Stack) -> None:
    async with api.http.get(api.base + "/openapi.json") as r:
        assert r.status == 200
        doc = await r.json()
    status, out = await api.call("GET", "/tokens")
    assert status == 200 and len(out["tokens"]) == 1, out
    own = out["tokens"][0]["id"]
    status, out = await api.call("POST", "/tokens", json={"name": "stand-in"})
    assert status == 201, out
    spare = _spare_the_token_in_use(own, out["token"]["id"])
    failures, scenarios = await asyncio.to_thread(_run, doc, api.base, api.token, spare)
    unique = sorted(set(failures))
    assert not unique, f"{len(unique)} schemathesis failures (seed {SEED}, {EXAMPLES} examples):\n" + "\n".join(unique)
    assert scenarios.get("stateful"), scenarios
    status, out = await api.call("GET", "/tokens")  # the run's requests were made with a working token
    assert status == 200, (SEED, out)


async def test_the_exemptions_are_the_api_answers_to_state_no_schema_shows(api: Stack) -> None:
    """What the run above lets through, replayed without schemathesis: schema-valid requests that
    the tenant's state refuses, answered 422 with details NOT_IN_ANY_SCHEMA names (a message
    changed would silently stop matching: each was, or could be, a failure of a random seed), and
    the 202 of a DELETE after which the resource is still there to read."""
    from types import SimpleNamespace

    from tests.integration.load_balancers.test_load_balancers import SERVICE

    async def raw(method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        async with api.http.request(method, api.base + path, json=body, headers=api.headers()) as r:
            return r.status, await r.read()

    status, out = await raw("POST", "/load-balancers", {"region": "dev-1", "name": "lb", "services": [SERVICE]})
    assert status == 202, out
    lb = json.loads(out)["load_balancer"]
    for path, body in (("update_service", {"listen_port": 80, "health_check": {"http": {"path": "/"}}}),
                       ("add_target", {"type": "ip", "ip": lb["public_net"]["ipv4"]["ip"]}),
                       ("add_target", {"type": "ip", "ip": "10.1.2.3"}), ("add_target", {"type": "ip", "ip": "203.0.113.99"})):
        status, out = await raw("POST", f"/load-balancers/{lb['id']}/actions/{path}", body)
        assert _unforeseeable(status, out), (path, status, out)

    from tests.integration.clusters.test_kubeconfig_credentials import _ready_cluster
    cid = await _ready_cluster(api)
    status, out = await raw("GET", f"/clusters/{cid}/kubeconfig?expiry_s=90000")
    assert _unforeseeable(status, out), (status, out)

    server, _ = await api.create_server("gone")
    status, out = await raw("DELETE", f"/servers/{server['id']}")
    assert status == 202, out
    status, out = await raw("GET", f"/servers/{server['id']}")
    assert status == 200 and json.loads(out)["server"]["status"] == "deleting", out

    def recorder(delete_status: int) -> Any:
        answer = SimpleNamespace(response=SimpleNamespace(status_code=delete_status))
        return SimpleNamespace(interactions={"del": answer})
    failure = SimpleNamespace(deleted_case_id="del")
    assert _deletion_only_accepted(recorder(202), failure)
    assert not _deletion_only_accepted(recorder(204), failure) and not _deletion_only_accepted(recorder(200), failure)


def test_the_run_never_revokes_the_token_it_authenticates_with() -> None:
    from types import SimpleNamespace

    spare = _spare_the_token_in_use("tok_own", "tok_stand_in")

    def case(method: str, path: str, rid: str) -> Any:
        return SimpleNamespace(operation=SimpleNamespace(method=method, path=path), path_parameters={"id": rid})
    for c, after in ((case("DELETE", "/tokens/{id}", "tok_own"), "tok_stand_in"),
                     (case("delete", "/tokens/{id}", "tok_other"), "tok_other"),
                     (case("GET", "/jobs/{id}", "tok_own"), "tok_own")):
        spare(None, c, {})
        assert c.path_parameters["id"] == after, c
