"""The client's exit codes and configuration as documented: every usage error is 64 (2 is a
deadline's, nothing else's) and an unknown flag prints the usage of the command that got it;
``-o json`` refusals are JSON on stderr; ``Z9_API_URL`` alone never sends a context's token to
another URL, and ``z9 context show`` says where the URL and the token each came from."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiohttp import web

from tests.support import free_port
from tests.integration.client.test_client import client_env, z9


async def test_every_usage_error_exits_64_with_the_usage_of_the_command(tmp_path: Path) -> None:
    env = client_env(None, tmp_path)
    for args, usage in (((), "usage: z9 "), (("frobnicate",), "usage: z9 "), (("servers",), "usage: z9 servers"),
                        (("servers", "frobnicate"), "usage: z9 servers"),
                        (("servers", "list", "--bogus"), "usage: z9 servers list"),
                        (("load-balancers", "create", "--name", "x", "--region", "r", "--bogus"),
                         "usage: z9 load-balancers create"),
                        (("clusters", "kubeconfig"), "usage: z9 clusters kubeconfig"),
                        (("jobs", "list", "--status", "sideways"), "usage: z9 jobs list"),
                        (("quota", "show", "--bogus"), "usage: z9 quota show"),
                        (("load-balancers", "add-target", "lb_x", "--server", "srv_x", "--ip", "192.0.2.1"), "")):
        code, out, err = await z9(*args, env={**env, "Z9_API_URL": "http://127.0.0.1:9/v1", "Z9_TOKEN": "t"})
        assert code == 64, (args, code, err)
        assert usage in err, (args, err)
        if "--bogus" in args:
            assert "unrecognized arguments: --bogus" in err and err.count("usage:") == 1, err


async def test_api_url_alone_never_sends_a_contexts_token_elsewhere(tmp_path: Path) -> None:
    seen: list[str | None] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"servers": [], "next_after": None})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    other = f"http://127.0.0.1:{port}/v1"
    try:
        env = client_env(None, tmp_path)
        secret = "z9t_the-contexts-own-secret"
        code, _, err = await z9("context", "set", "dev", "--api-url", "http://127.0.0.1:9/v1", "--token", secret,
                                env=env)
        assert code == 0, err
        for cmd in (("servers", "list"), ("context", "show")):
            code, out, err = await z9(*cmd, env={**env, "Z9_API_URL": other})
            assert code == 4, (cmd, out, err)
            assert "Z9_API_URL" in err and "context 'dev'" in err and "Z9_TOKEN" in err, err
        code, out, err = await z9("servers", "list", "-o", "json", env={**env, "Z9_API_URL": other})
        assert code == 4 and json.loads(err)["error"]["code"] == "configuration", err
        assert seen == [], seen  # nothing reached the other URL, the token least of all
        # with its own token the other URL is fine, and `context show` says where each came from
        code, out, err = await z9("servers", "list", env={**env, "Z9_API_URL": other, "Z9_TOKEN": "z9t_mine"})
        assert code == 0, err
        assert seen == ["Bearer z9t_mine"]
        code, out, err = await z9("context", "show", "-o", "json", env={**env, "Z9_API_URL": other,
                                                                         "Z9_TOKEN": "z9t_mine"})
        shown = json.loads(out)
        assert (shown["api_url"], shown["api_url_from"], shown["token_from"]) == (other, "Z9_API_URL", "Z9_TOKEN")
        # the context's own URL from the environment: its token may go there, and is said to come from it
        code, out, err = await z9("context", "show", "-o", "json", env={**env, "Z9_API_URL": "http://127.0.0.1:9/v1"})
        shown = json.loads(out)
        assert code == 0 and shown["api_url_from"] == "Z9_API_URL" and shown["token_from"].startswith("context 'dev'")
        code, out, err = await z9("context", "show", "-o", "json", env=env)
        shown = json.loads(out)
        assert shown["api_url_from"] == shown["token_from"] == shown["from"] and "dev" in shown["from"], shown
    finally:
        await runner.cleanup()


async def test_a_refusal_under_json_output_is_json_on_stderr(tmp_path: Path) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"code": "server_deleting", "message": "server srv_1 is deleting",
                                            "details": None}}, status=409)

    app = web.Application()
    app.router.add_post("/v1/servers/{id}/actions/{action}", refuse)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        env = client_env(None, tmp_path, Z9_API_URL=f"http://127.0.0.1:{port}/v1", Z9_TOKEN="t")
        code, out, err = await z9("servers", "reboot", "srv_1", "-o", "json", env=env)
        assert code == 3 and out == ""
        assert json.loads(err) == {"error": {"code": "server_deleting", "message": "server srv_1 is deleting",
                                             "details": None}, "status": 409}
        code, out, err = await z9("servers", "reboot", "srv_1", env=env)
        assert code == 3 and "refused (409 server_deleting): server srv_1 is deleting" in err
    finally:
        await runner.cleanup()


async def test_wait_follows_every_job_the_answer_lists(tmp_path: Path) -> None:
    """A 202 that lists more jobs than its own (``jobs``: e.g. a server's create and its address's
    assign) is waited for as a whole: --wait returns once the last of them is done."""
    polls: dict[str, int] = {"job_a": 0, "job_b": 0}
    server = {"id": "srv_1", "name": "web", "region": "r", "image": "debian-12", "cores": 1, "memory_mib": 1024,
              "disk_gib": 10, "status": "running", "observed": {}}

    def job(jid: str, kind: str, status: str) -> dict:
        return {"id": jid, "kind": kind, "region": "r", "status": status,
                "finished_at": "2026-12-01T04:00:00Z" if status == "succeeded" else None}

    async def create(request: web.Request) -> web.Response:
        return web.json_response({"server": server, "job": job("job_a", "ServerCreate", "pending"),
                                  "jobs": [job("job_a", "ServerCreate", "pending"),
                                           job("job_b", "AddressAssign", "pending")]}, status=202)

    async def get_job(request: web.Request) -> web.Response:
        jid = request.match_info["id"]
        polls[jid] += 1
        done = jid == "job_a" or polls[jid] >= 3  # the assign needs a few more polls
        kind = "ServerCreate" if jid == "job_a" else "AddressAssign"
        return web.json_response(job(jid, kind, "succeeded" if done else "running"))

    async def get_server(request: web.Request) -> web.Response:
        return web.json_response({"server": server})

    app = web.Application()
    app.router.add_post("/v1/servers", create)
    app.router.add_get("/v1/jobs/{id}", get_job)
    app.router.add_get("/v1/servers/{id}", get_server)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        env = client_env(None, tmp_path, Z9_API_URL=f"http://127.0.0.1:{port}/v1", Z9_TOKEN="t")
        code, out, err = await z9("servers", "create", "--name", "web", "--region", "r", "--image", "debian-12",
                                  "--cores", "1", "--memory-mib", "1024", "--disk-gib", "10", "--wait", "-o", "json",
                                  env=env)
        assert code == 0, err
        assert polls["job_b"] >= 3, polls  # followed to its end, after the create's own job
        assert "AddressAssign: succeeded" in err, err
        code, out, err = await z9("servers", "create", "--name", "web", "--region", "r", "--image", "debian-12",
                                  "--cores", "1", "--memory-mib", "1024", "--disk-gib", "10", "-o", "json", env=env)
        assert code == 0 and [j["id"] for j in json.loads(out)["jobs"]] == ["job_a", "job_b"]  # the API's answer
    finally:
        await runner.cleanup()


def test_kubeconfig_merge_target_and_merge_follow_kubectls_rules(tmp_path: Path) -> None:
    """Where ``z9 clusters kubeconfig --merge`` writes (kubectl's rules for $KUBECONFIG) and what a
    merge keeps: the other entries, one z9-<name> of each, the current context switched."""
    import yaml

    from z9.resources.cluster.client import kubeconfig_path, merge_kubeconfig

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    env = {"KUBECONFIG": f"{a}:{b}:{c}"}
    assert kubeconfig_path("z9-x", env) == c  # none exists: the last
    b.write_text(yaml.safe_dump({"contexts": [{"name": "other", "context": {}}]}))
    assert kubeconfig_path("z9-x", env) == b  # the first that exists
    c.write_text(yaml.safe_dump({"contexts": [{"name": "z9-x", "context": {}}]}))
    assert kubeconfig_path("z9-x", env) == c  # the one that defines it
    assert kubeconfig_path("z9-x", {"HOME": str(tmp_path)}).name == "config"  # unset: ~/.kube/config
    fetched = yaml.safe_dump({"clusters": [{"name": "x", "cluster": {"server": "https://203.0.113.9:6443"}}],
                              "users": [{"name": "z9-admin-1", "user": {"client-key-data": "k"}}],
                              "contexts": [{"name": "z9-admin-1@x", "context": {}}], "current-context": "z9-admin-1@x"})
    once = merge_kubeconfig(b.read_text(), fetched, "z9-x")
    twice = yaml.safe_load(merge_kubeconfig(once, fetched, "z9-x", set_current=False))
    assert [x["name"] for x in twice["contexts"]] == ["other", "z9-x"]
    assert [x["name"] for x in twice["users"]] == ["z9-x"] and twice["current-context"] == "z9-x"
    assert twice["contexts"][1]["context"] == {"cluster": "z9-x", "user": "z9-x"}
    kept = yaml.safe_load(merge_kubeconfig(yaml.safe_dump({**twice, "current-context": "other"}), fetched, "z9-x",
                                           set_current=False))
    assert kept["current-context"] == "other"
