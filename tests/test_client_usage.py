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
from tests.test_client import client_env, z9


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
