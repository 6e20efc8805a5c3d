"""The customer client against a real stack (API + executor + the simulator over HTTPS): `z9 servers
create … --wait` prints step progress and exits 0; a job the simulator fails exits 1 with its
error; a 2 s deadline on a slow job exits 2; a 409 prints the precondition and is not retried.
And the HTTP client's retries (503/429 after Retry-After, one Idempotency-Key per POST), config
contexts, and the separated --help."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from z9.client import Client, Conflict
from z9.client.config import ConfigError, resolve

from tests.support import REGION, SimAdmin, Stack, free_port

Z9 = os.path.join(os.path.dirname(sys.executable), "z9")


async def z9(*args: str, env: dict[str, str], timeout_s: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(Z9, *args, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    return proc.returncode, out.decode(), err.decode()  # type: ignore[return-value]


def client_env(stack: Stack | None, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    env["Z9_CONFIG"] = str(tmp_path / "z9-config.toml")
    if stack is not None:
        env.update(Z9_API_URL=stack.base, Z9_TOKEN=stack.token)
    env.update(extra)
    return env


CREATE = ["servers", "create", "--region", REGION, "--image", "debian-12", "--cores", "1", "--memory-mib", "1024",
          "--disk-gib", "10"]


async def test_create_wait_shows_progress_and_exits_0(stack: Stack, tmp_path: Path) -> None:
    env = client_env(stack, tmp_path)
    code, out, err = await z9(*CREATE, "--name", "cli-1", "--wait", env=env)
    assert code == 0, (out, err)
    # live progress as the long-poll saw each change: a step that ran and ended between two answers
    # (configure takes ~0.1 s) shows only as done, so "running" is asserted for the job, every step's end
    for step in ("clone", "configure", "start"):
        assert f"step {step}: done" in err, err
    assert "ServerCreate: running" in err, err
    assert "ServerCreate: succeeded" in err
    assert "running" in out and "cli-1" in out
    # json output: the server as it ended, and the job
    code, out, err = await z9("servers", "list", "-o", "json", env=env)
    assert code == 0
    servers = json.loads(out)["servers"]
    assert [s["status"] for s in servers if s["name"] == "cli-1"] == ["running"]
    sid = servers[0]["id"]
    # delete and restore, waiting each time
    code, out, err = await z9("servers", "delete", sid, "--wait", "-o", "json", env=env)
    assert code == 0, err
    assert json.loads(out)["server"]["status"] == "deleting"
    code, out, err = await z9("servers", "restore", sid, "--wait", "-o", "json", env=env)
    assert code == 0, err
    assert json.loads(out)["server"]["observed"]["power_state"] == "running"
    # a 409 prints the precondition and exits 3, without a retry
    code, out, err = await z9("servers", "restore", sid, env=env)
    assert code == 3 and "409" in err and "not deleting" in err, err
    code, out, err = await z9(*CREATE, "--name", "cli-1", env=env)
    assert code == 3 and "already exists" in err
    # jobs: list by actor, get, wait on a finished job
    code, out, err = await z9("jobs", "list", "--actor", "me", "-o", "json", env=env)
    jobs = json.loads(out)["jobs"]
    assert [j["kind"] for j in jobs] == ["ServerStart", "ServerStop", "ServerCreate"]  # newest first
    code, out, err = await z9("jobs", "wait", jobs[0]["id"], env=env)
    assert code == 0 and "succeeded" in out


async def test_a_job_failed_by_the_simulator_exits_1_with_its_error(stack: Stack, sim: SimAdmin,
                                                                  tmp_path: Path) -> None:
    sim.allow_rejections = True
    await sim.fault(method="POST", path=r"/clone$", action="error", status=400,
                    reason="Parameter verification failed.", times=1)
    code, out, err = await z9(*CREATE, "--name", "cli-fail", "--wait", env=client_env(stack, tmp_path))
    assert code == 1, (out, err)
    assert "failed: permanent:" in err and "400" in err, err
    assert "failed" in out


async def test_a_deadline_exits_2(stack: Stack, sim: SimAdmin, tmp_path: Path) -> None:
    await sim.configure(task_seconds={"qmclone": 30})
    t0 = asyncio.get_running_loop().time()
    code, out, err = await z9(*CREATE, "--name", "cli-slow", "--wait", "--timeout", "2",
                              env=client_env(stack, tmp_path))
    took = asyncio.get_running_loop().time() - t0
    assert code == 2, (out, err)
    assert "deadline" in err and "z9 jobs wait job_" in err
    assert took < 15, took
    code, out, err = await z9("jobs", "list", "-o", "json", env=client_env(stack, tmp_path))
    assert json.loads(out)["jobs"][0]["status"] == "running"  # still going: only the client gave up


async def test_config_errors_and_usage_exit_codes(tmp_path: Path) -> None:
    env = client_env(None, tmp_path)
    code, out, err = await z9("servers", "list", env=env)
    assert code == 4 and "Z9_API_URL" in err
    code, out, err = await z9("servers", "create", "--name", "x", env=env)
    assert code == 64
    code, out, err = await z9(*CREATE, "--name", "Bad_Name", env={**env, "Z9_API_URL": "http://127.0.0.1:9/v1",
                                                                 "Z9_TOKEN": "t"})
    assert code == 64 and "name" in err  # checked by the API's own model before sending
    # nothing listening: retried Z9_CLIENT_MAX_RETRIES times (one here: its pause, 0.5 s ± 25 %, shows it
    # was), then "cannot reach" (the 5 retries by default, ~15 s, are the Python client's test's below)
    unreachable = {**env, "Z9_API_URL": f"http://127.0.0.1:{free_port()}/v1", "Z9_TOKEN": "t"}
    t0 = asyncio.get_running_loop().time()
    code, out, err = await z9("servers", "list", env={**unreachable, "Z9_CLIENT_MAX_RETRIES": "1"}, timeout_s=120)
    assert code == 4 and "cannot reach" in err
    assert asyncio.get_running_loop().time() - t0 >= 0.375
    code, out, err = await z9("servers", "list", "-o", "json", env={**unreachable, "Z9_CLIENT_MAX_RETRIES": "few"})
    assert code == 4 and json.loads(err)["error"]["code"] == "configuration" and "Z9_CLIENT_MAX_RETRIES" in err, err


async def test_contexts(tmp_path: Path, stack: Stack) -> None:
    env = client_env(None, tmp_path)
    code, _, err = await z9("context", "set", "dev", "--api-url", stack.base, "--token", stack.token, env=env)
    assert code == 0, err
    assert oct((tmp_path / "z9-config.toml").stat().st_mode & 0o777) == "0o600"
    code, _, _ = await z9("context", "set", "other", "--api-url", "http://127.0.0.1:9/v1", "--token", "nope", env=env)
    code, out, _ = await z9("context", "list", "-o", "json", env=env)
    assert [(c["name"], c["current"]) for c in json.loads(out)["contexts"]] == [("dev", True), ("other", False)]
    assert stack.token not in out  # masked
    code, out, err = await z9("servers", "list", env=env)  # the current context
    assert code == 0, err
    code, out, err = await z9("servers", "list", "--context", "other", env={**env, "Z9_CLIENT_MAX_RETRIES": "0"})
    assert code == 4 and "cannot reach the z9 API at http://127.0.0.1:9/v1" in err, err
    code, _, _ = await z9("context", "use", "other", env=env)
    code, out, err = await z9("servers", "list", env={**env, "Z9_CONTEXT": "dev"})
    assert code == 0
    # the environment beats the file's current context
    code, out, err = await z9("servers", "list", env={**env, "Z9_API_URL": stack.base, "Z9_TOKEN": stack.token})
    assert code == 0
    with pytest.raises(ConfigError):
        resolve(env={"Z9_CONFIG": str(tmp_path / "missing.toml")})


async def test_help_separates_customer_and_operator_commands(tmp_path: Path) -> None:
    code, out, _ = await z9("--help", env=client_env(None, tmp_path))
    assert code == 0
    customer, operator = out.split("operator commands")
    assert "customer commands" in customer
    for name in ("servers", "jobs", "tokens", "context"):
        assert f"\n  {name} " in customer and f"\n  {name} " not in operator
    for name in ("api", "executor", "scheduler", "reaper", "migrate", "token", "dev"):
        assert f"\n  {name} " in operator and f"\n  {name} " not in customer


# ---------------------------------------------------------------------------------- the HTTP client

async def test_client_retries_503_and_429_after_retry_after_with_one_idempotency_key() -> None:
    seen: list[tuple[str, str | None]] = []
    answers = [(503, {"Retry-After": "1"}), (429, {"Retry-After": "2"}), (202, {})]

    async def create(request: web.Request) -> web.Response:
        seen.append((request.method, request.headers.get("Idempotency-Key")))
        status, headers = answers.pop(0)
        if status != 202:
            return web.json_response({"error": {"code": "x", "message": "later", "details": None}}, status=status,
                                     headers=headers)
        return web.json_response({"server": SERVER, "job": {"id": "job_1", "kind": "ServerCreate",
                                                             "status": "pending"}}, status=202)

    async def restore(request: web.Request) -> web.Response:
        seen.append((request.method, request.headers.get("Idempotency-Key")))
        return web.json_response({"error": {"code": "conflict", "message": "server is running, not deleting",
                                            "details": None}}, status=409)

    app = web.Application()
    app.router.add_post("/v1/servers", create)
    app.router.add_post("/v1/servers/{id}/actions/cancel-deletion", restore)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    slept: list[float] = []
    try:
        c = Client(f"http://127.0.0.1:{port}/v1", "t", sleep=slept.append)
        accepted = await asyncio.to_thread(c.create_server, {"name": "web-1", "region": "r", "image": "debian-12",
                                                             "cores": 1, "memory_mib": 1024, "disk_gib": 10})
        assert accepted.job.id == "job_1" and accepted.resource.name == "web-1"
        assert slept == [1.0, 2.0]
        keys = {k for _, k in seen}
        assert len(seen) == 3 and len(keys) == 1 and None not in keys  # one key, on every retry
        seen.clear()
        with pytest.raises(Conflict) as e:
            await asyncio.to_thread(c.restore_server, "srv_1")
        assert "not deleting" in e.value.message and len(seen) == 1  # never retried
    finally:
        await runner.cleanup()


def test_client_retries_a_refused_connection_max_retries_times_then_is_unreachable() -> None:
    from z9.client import Unreachable
    from z9.client.config import DEFAULT_MAX_RETRIES, max_retries

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    for n in (DEFAULT_MAX_RETRIES, 0):
        slept: list[float] = []
        c = Client(url, "t", max_retries=n, sleep=slept.append)
        with pytest.raises(Unreachable) as e:
            c.list_servers()
        assert "cannot reach the z9 API" in e.value.message
        # backing off 0.5 s, doubling, ±25 % (about 15 s in all by default)
        assert len(slept) == c.retries == n
        assert all(0.75 * 0.5 * 2 ** i <= s <= 1.25 * 0.5 * 2 ** i for i, s in enumerate(slept)), slept
    assert max_retries({}) == DEFAULT_MAX_RETRIES == 5 and max_retries({"Z9_CLIENT_MAX_RETRIES": " 2 "}) == 2
    for bad in ("-1", "1.5", "x"):
        with pytest.raises(ConfigError, match="Z9_CLIENT_MAX_RETRIES"):
            max_retries({"Z9_CLIENT_MAX_RETRIES": bad})


SERVER: dict[str, Any] = {"id": "srv_1", "name": "web-1", "region": "r", "image": "debian-12", "cores": 1,
                          "memory_mib": 1024, "disk_gib": 10, "status": "creating",
                          "observed": {"vmid": None, "node": None, "power_state": None, "at": None}}


def test_progress_on_a_terminal_is_a_live_table() -> None:
    import io

    from rich.console import Console

    from z9.client.models import Job
    from z9.client.progress import StepProgress

    buf = io.StringIO()
    progress = StepProgress(Console(file=buf, force_terminal=True, width=100))
    job = Job.model_validate({"id": "job_1", "kind": "ServerCreate", "region": "r", "status": "running", "attempt": 1,
                              "max_attempts": 10, "steps": [{"name": "clone", "state": "running",
                                                             "started_at": "2026-12-01T04:00:00Z",
                                                             "detail": {"vmid": 101}}]})
    progress.update(job)
    progress.update(job.model_copy(update={"status": "succeeded"}))
    progress.close()
    text = buf.getvalue()
    assert "clone" in text and "vmid=101" in text and "succeeded" in text
    assert "\x1b[" in text  # drawn in place, not line by line


async def test_power_resize_labels_addresses_and_catalogue_from_the_client(stack: Stack, tmp_path: Path) -> None:
    """A new user drives a server from the client alone: power, resize, labels, an address."""
    env = client_env(stack, tmp_path)
    code, out, err = await z9("regions", "list", "-o", "json", env=env)
    assert code == 0 and json.loads(out)["regions"][0]["name"] == REGION
    code, out, err = await z9("images", "list", env=env)
    assert code == 0 and "debian-12" in out and "KUBERNETES" in out, out
    assert any(ln.split()[:1] == ["debian-12-k8s-1.33"] and ln.split()[-1] == "1.33.5" for ln in out.splitlines()), out
    code, out, err = await z9(*CREATE, "--name", "cli-p", "--wait", "-o", "json", env=env)
    assert code == 0, err
    sid = json.loads(out)["server"]["id"]
    code, out, err = await z9("servers", "resize", sid, "--cores", "2", env=env)
    assert code == 3 and "not stopped" in err, err
    code, out, err = await z9("servers", "stop", sid, "--wait", "-o", "json", env=env)
    assert code == 0, err
    assert "step shutdown: done" in err and json.loads(out)["server"]["status"] == "stopped"
    code, out, err = await z9("servers", "resize", sid, "--cores", "2", "--disk-gib", "20", "--wait", "-o", "json",
                              env=env)
    assert code == 0, err
    got = json.loads(out)["server"]
    assert (got["cores"], got["disk_gib"]) == (2, 20)
    code, out, err = await z9("servers", "start", sid, "--wait", env=env)
    assert code == 0 and "step start: done" in err, err
    code, out, err = await z9("servers", "reboot", sid, "--wait", env=env)
    assert code == 0, err
    code, out, err = await z9("servers", "update", sid, "--label", "env=prod", "--name", "cli-q", "-o", "json",
                              env=env)
    assert code == 0 and json.loads(out)["server"]["labels"] == {"env": "prod"}, err
    code, out, err = await z9("servers", "list", "-l", "env=prod", "-o", "json", env=env)
    assert [s["name"] for s in json.loads(out)["servers"]] == ["cli-q"]
    code, out, err = await z9("servers", "list", "-l", "env!=prod", "-o", "json", env=env)
    assert json.loads(out)["servers"] == []
    code, out, err = await z9("addresses", "create", "--region", REGION, "--name", "cli-a", "--server", sid,
                              "--wait", "-o", "json", env=env)
    assert code == 0, err
    adr = json.loads(out)["address"]
    assert adr["server_id"] == sid and adr["status"] == "active"
    code, out, err = await z9("addresses", "unassign", adr["id"], "--wait", env=env)
    assert code == 0, err
    code, out, err = await z9("addresses", "list", "-o", "json", env=env)
    assert [a["server_id"] for a in json.loads(out)["addresses"]] == [None]
    code, out, err = await z9("servers", "poweroff", sid, "--wait", env=env)
    assert code == 0 and "step poweroff: done" in err, err


async def test_create_with_a_public_ipv4_and_tables_that_never_cut_ids(stack: Stack, tmp_path: Path) -> None:
    """`--public-ipv4` asks for a primary address (from the pool, or a given one); a table piped or on
    a narrow terminal keeps every id whole (the new-user run could not copy one from `jobs list`)."""
    env = client_env(stack, tmp_path, COLUMNS="60")
    code, out, err = await z9(*CREATE, "--name", "cli-ip", "--public-ipv4", "-o", "json", env=env)
    assert code == 0, err
    server = json.loads(out)["server"]
    assert server["public_ipv4"]["ip"].startswith("203.0.113."), server
    code, out, err = await z9("addresses", "create", "--region", REGION, "--name", "given", "--wait", "-o", "json",
                              env=env)
    assert code == 0, err
    given = json.loads(out)["address"]["id"]
    code, out, err = await z9(*CREATE, "--name", "cli-ip-2", "--public-ipv4", given, "-o", "json", env=env)
    assert code == 0, err
    assert json.loads(out)["server"]["public_ipv4"]["id"] == given
    code, _, err = await z9(*CREATE, "--name", "cli-ip-3", "--public-ipv4", "nope", env=env)
    assert code == 64 and "an address id" in err, err
    code, out, err = await z9("jobs", "list", env=env)
    assert code == 0, err
    ids = [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    assert ids and all(len(i) == len("job_") + 26 for i in ids), out
