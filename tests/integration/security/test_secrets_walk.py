"""Every secret z9 holds, walked through a running stack (API, executor, scheduler, reaper against
the simulator, a Kubernetes cluster made and a token minted): the Proxmox token secret, the
installation key, the clusters' CA private keys, the join tokens and the API token secrets. Each
may appear only where it must — a new token's secret once, in the answer that made it — and never
in a log line, another API answer, the metrics, a trace span, the database in clear, or a file
others may read."""
from __future__ import annotations

import base64
import io
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from z9.common import pki, tracing
from z9.common.logs import make_handler
from z9.sim.server import SimServer

from tests.conftest import TEST_INSTALLATION_KEY
from tests.support import REGION, SimAdmin, Stack
from z9.resources.cluster import store as cluster_store

K8S_TIMING = {"guest_boot_s": 0.2, "cloud_init_s": 0.2, "k8s_api_delay_s": 0.3}


@pytest.fixture
def every_log_line() -> Iterator[io.StringIO]:
    """Every record of every logger, DEBUG and up, as the services' JSON lines."""
    out = io.StringIO()
    handler = make_handler("test", "json", stream=out)
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


@pytest.fixture
def every_span(sim_server: SimServer) -> Iterator[InMemorySpanExporter]:
    """Every span the stack exports while the test runs: the SDK provider and its gated in-memory
    exporter of tests/integration/observability/test_tracing.py (a process sets its provider once), opened for this test."""
    from tests.integration.observability import test_tracing as tt

    if tt._GATE is None:
        provider = tracing.make_provider("test", [SimpleSpanProcessor(tt._EXPORTER)])
        tt._GATE = provider.sampler = tt._Gate(provider.sampler)
        tracing.install(provider)
    else:
        tracing.install(trace.get_tracer_provider())
    tt._GATE.open = True
    tt._EXPORTER.clear()
    try:
        yield tt._EXPORTER
    finally:
        tt._GATE.open = False
        tracing.uninstall_instrumentation()
        tt._EXPORTER.clear()


def _pem_body(pem: str) -> str:
    """A distinctive piece of a PEM private key: its first base64 line (64 characters, private)."""
    lines = [ln for ln in pem.splitlines() if ln and not ln.startswith("-----")]
    return lines[0][48:]  # past the PKCS#8 header every EC P-256 key shares: the private scalar


def _span_text(span: Any) -> str:
    return json.dumps({"name": span.name, "attributes": dict(span.attributes or {}),
                       "events": [{"name": e.name, "attributes": dict(e.attributes or {})} for e in span.events],
                       "status": str(span.status.description)}, default=str)


async def test_every_secret_appears_only_where_it_must(stack: Stack, sim: SimAdmin, sim_server: SimServer,
                                                       every_log_line: io.StringIO,
                                                       every_span: InMemorySpanExporter, tmp_path: Path) -> None:
    answers: list[tuple[str, str]] = []  # (what, body) of every answer the walk saw

    async def call(method: str, path: str, **kw: Any) -> Any:
        async with stack.http.request(method, stack.base + path, headers=stack.headers(), **kw) as r:
            text = await r.text()
            answers.append((f"{method} {path} -> {r.status}", text + json.dumps(dict(r.headers))))
            assert r.status < 500, (path, text)
            return json.loads(text) if text else None

    # ---- the walk: a token, a server, a cluster (its CA keys, its join tokens), kubeconfigs, lists
    minted = await call("POST", "/tokens", json={"name": "walk", "scopes": ["read"]})
    new_secret = minted["secret"]
    token_answer = answers[-1]
    # the web console: a session (its id in the sign-in's Set-Cookie only), used, then signed out
    console = stack.base.removesuffix("/v1") + "/console/session"

    async def console_call(method: str, url: str, **kw: Any) -> tuple[Any, str]:
        async with stack.http.request(method, url, **kw) as r:
            text = await r.text()
            answers.append((f"{method} {url} -> {r.status}", text + json.dumps(dict(r.headers))))
            assert r.status < 500, (url, text)
            return r, text
    signed_in, session_body = await console_call("POST", console, json={"token": new_secret})
    session_id = signed_in.cookies["z9_console"].value
    session_answer = answers[-1]
    cookie = {"Cookie": f"z9_console={session_id}"}
    csrf = json.loads((await console_call("GET", console, headers=cookie))[1])["csrf_token"]
    await console_call("GET", stack.base + "/servers", headers=cookie)
    await console_call("GET", stack.base + "/tokens", headers=cookie)
    await console_call("DELETE", console, headers={**cookie, "X-CSRF-Token": csrf})
    assert (await console_call("GET", stack.base + "/servers", headers=cookie))[0].status == 401  # signed out
    await sim.configure(**K8S_TIMING)
    created = await call("POST", "/servers", json={"name": "walk-1", "region": REGION, "image": "debian-12",
                                                    "cores": 1, "memory_mib": 1024, "disk_gib": 10})
    made = await call("POST", "/clusters", json={
        "name": "walk", "region": REGION, "version": "1.33",
        "control_plane": {"count": 1, "cores": 2, "memory_mib": 4096, "disk_gib": 30},
        "node_pools": [{"name": "workers", "count": 1, "cores": 2, "memory_mib": 2048, "disk_gib": 20}]})
    cid = made["cluster"]["id"]
    for job in (created["job"], made["job"]):
        done = await stack.wait_job(job["id"], timeout_s=180)
        assert done["status"] == "succeeded", done
    kubeconfig = await call("GET", f"/clusters/{cid}/kubeconfig")
    for path in ("/servers", "/clusters", f"/clusters/{cid}", "/jobs?limit=500", "/tokens", "/addresses",
                 "/load-balancers", f"/jobs/{made['job']['id']}", f"/jobs/{created['job']['id']}", "/openapi.json"):
        await call("GET", path)
    async with stack.http.get(stack.metrics_url) as r:
        metrics_text = await r.text()
    async with stack.http.get(stack.base.removesuffix("/v1") + "/healthz") as r:
        assert r.status == 200

    # ---- the secrets z9 holds
    key = pki.InstallationKey.parse(TEST_INSTALLATION_KEY)
    material = key.open(cid, *await cluster_store.cluster_keys_get(stack.pool, cid))
    ca_keys = {name: _pem_body(pem) for name, pem in material.items() if name.endswith(".key")}
    assert {"ca.key", "etcd/ca.key", "sa.key", "front-proxy-ca.key"} <= set(ca_keys)
    memo = json.loads(await stack.pool.fetchval("SELECT memo::text FROM jobs WHERE id = $1", made["job"]["id"]))
    join_tokens = [key.open(f"{cid}/join/{k.removeprefix('token:')}", v["key_id"], base64.b64decode(v["nonce"]),
                            base64.b64decode(v["sealed"]))["token"]
                   for k, v in memo.items() if k.startswith("token:")]
    assert join_tokens, memo  # the worker joined with one
    secrets = {
        "the Proxmox token secret": stack.settings.regions[REGION].token_secret.get_secret_value(),
        "the installation key": TEST_INSTALLATION_KEY,
        "the installation key (raw, base64)": base64.b64encode(key.raw).decode().rstrip("="),
        **{f"CA key {n}": body for n, body in ca_keys.items()},
        **{f"join token {i}": t for i, t in enumerate(join_tokens)},
        "the tenant's API token secret": stack.token,
        "a minted API token's secret": new_secret,
        "a console session id": session_id,
    }

    # ---- where they must never be
    places: dict[str, list[tuple[str, str]]] = {
        "log": [("log", every_log_line.getvalue())],
        "answer": [a for a in answers if a is not token_answer and a is not session_answer],
        "metrics": [("metrics", metrics_text)],
        "trace": [(f"span {s.name}", _span_text(s)) for s in every_span.get_finished_spans()],
    }
    assert places["log"][0][1].count("\n") > 20 and places["trace"], "the walk produced no logs or no spans"
    # the database, every table in clear (sealed blobs and token hashes are fine)
    db_rows = []
    for (table,) in await stack.pool.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"):
        rows = await stack.pool.fetch(f'SELECT t::text AS row FROM "{table}" t')
        db_rows.append((f"table {table}", "\n".join(r["row"] for r in rows)))
    places["database"] = db_rows
    # files others may read: the simulator's state (holding the guests' keys) and certificates,
    # and everything the test wrote
    sim_server.config.state_file = tmp_path / "sim-state.json"
    try:
        sim_server.save_state()
    finally:
        sim_server.config.state_file = None
    state = tmp_path / "sim-state.json"
    assert stat.S_IMODE(state.stat().st_mode) == 0o600, oct(state.stat().st_mode)
    # (it holds the guests' disks and storage — bootstrap ISOs with CA keys while they exist): 0600
    readable = []
    for root in (tmp_path, sim_server.cert_path.parent):
        for dirpath, _, files in os.walk(root):
            for f in files:
                p = Path(dirpath) / f
                if p.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
                    readable.append((f"world-readable file {p}", p.read_text(errors="replace")))
    places["file"] = readable

    found = [(name, where) for name, value in secrets.items() for kind in places.values()
             for where, text in kind if value in text]
    assert not found, f"secrets where they must not be: {found}"
    # the one place a token secret appears: the answer that made it (once)
    assert new_secret in token_answer[1] and stack.token not in token_answer[1]
    # the one place a console session id appears: the sign-in's Set-Cookie (never its body)
    assert session_id in session_answer[1] and new_secret not in session_answer[1]
    assert session_id not in session_body
    # a kubeconfig carries the CA certificate and a client key, never a CA key
    assert not [n for n, body in ca_keys.items() if body in json.dumps(kubeconfig)]
    assert not [t for t in join_tokens if t in json.dumps(kubeconfig)]
