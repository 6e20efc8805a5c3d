"""What the client and the API say when something is off, in the user's own terms: a field's
refusal names the flag typed (``--expires-in``, not ``expires_in_s``) and says a pattern in words
(never its regex); "an address"; ``z9 jobs list --kind Bogus`` is refused (422 naming the kinds, as every bad query parameter)
rather than an empty list (422, as every bad query parameter); an API URL without ``/v1`` is said to be one; every ``-o json``
refusal's ``details`` is a list, as the README promises."""
from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from tests.integration.client.test_client import client_env, z9
from tests.support import Stack, free_port


async def test_a_field_refusal_names_the_flag_and_says_the_pattern_in_words(tmp_path: Path) -> None:
    env = client_env(None, tmp_path, Z9_API_URL="http://127.0.0.1:9/v1", Z9_TOKEN="t")
    code, _, err = await z9("tokens", "create", "--name", "x", "--expires-in", "10", env=env)
    assert code == 64 and "--expires-in:" in err and "expires_in_s" not in err, err
    code, _, err = await z9("servers", "create", "--name", "Bad_Name", "--region", "r", "--image", "i", "--cores", "1",
                            "--memory-mib", "1024", "--disk-gib", "10", env=env)
    assert code == 64 and "--name: must be a DNS label" in err, err
    assert "[a-z0-9]" not in err and "pattern" not in err, err


async def test_an_address_and_the_kinds_of_jobs(stack: Stack, tmp_path: Path) -> None:
    env = client_env(stack, tmp_path)
    code, out, _ = await z9("addresses", "--help", env=env)
    assert "show an address" in out and "a address" not in out and "addresss" not in out, out
    code, _, err = await z9("jobs", "list", "--kind", "Bogus", env=env)
    assert code == 3 and "422" in err and "no job kind 'Bogus'" in err and "ServerCreate" in err, err
    code, _, err = await z9("jobs", "list", "--kind", "Bogus", "-o", "json", env=env)
    assert code == 3 and isinstance(json.loads(err)["error"]["details"], list), err
    code, out, err = await z9("jobs", "list", "--kind", "ServerCreate", env=env)
    assert code == 0, err
    # a name in use by a deleting address: "an address named …"
    body = {"region": "dev-1", "name": "www-held"}
    status, made = await stack.call("POST", "/addresses", json=body)
    assert status == 202, made
    await stack.wait_job(made["job"]["id"])
    status, _ = await stack.call("DELETE", f"/addresses/{made['address']['id']}")
    assert status == 202
    status, again = await stack.call("POST", "/addresses", json=body)
    assert status == 409 and again["error"]["message"].startswith("an address named 'www-held'"), again


async def test_an_api_url_without_v1_is_said_to_be_one(tmp_path: Path) -> None:
    async def not_z9(request: web.Request) -> web.Response:  # what a z9 API answers off /v1: a bare 404
        return web.Response(status=404, text="404: Not Found")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", not_z9)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        env = client_env(None, tmp_path, Z9_API_URL=f"http://127.0.0.1:{port}", Z9_TOKEN="t")
        code, _, err = await z9("servers", "list", env=env)
        assert code == 3 and "ends in /v1" in err, err
    finally:
        await runner.cleanup()


async def test_every_json_refusal_has_a_list_of_details(tmp_path: Path) -> None:
    env = client_env(None, tmp_path, Z9_API_URL="http://127.0.0.1:9/v1", Z9_TOKEN="t", Z9_CLIENT_MAX_RETRIES="0")
    for args in (("servers", "list", "-o", "json"),  # unreachable
                 ("tokens", "create", "--name", "x", "--expires-in", "10", "-o", "json")):  # a field refused
        code, _, err = await z9(*args, env=env)
        assert code != 0 and isinstance(json.loads(err)["error"]["details"], list), (args, err)


async def test_a_bad_api_url_is_one_line_and_its_password_is_masked(tmp_path: Path) -> None:
    """A URL the client cannot use is one line naming it (never a traceback), with the password of
    its credentials masked; ``z9 context set`` refuses it before saving."""
    env = client_env(None, tmp_path, Z9_TOKEN="z9t_x", Z9_CLIENT_MAX_RETRIES="0")
    port = free_port()  # nothing listens there
    code, out, err = await z9("servers", "list", "--api-url", f"http://u:hunter2pass@127.0.0.1:{port}/v1", env=env)
    assert code == 4 and "hunter2pass" not in out + err and "Traceback" not in err, err
    assert err.strip().count("\n") == 0 and "u:***@127.0.0.1" in err, err
    for url, why in (("http://127.0.0.1:99999/v1", "Port out of range"), ("127.0.0.1:8080/v1", "http:// or https://"),
                     ("ftp://x", "http:// or https://"), ("http://[::1", "not a URL"),
                     ("http://u:hunter2pass@[::1/v1", "not a URL"), ("http:///v1", "no host")):
        code, out, err = await z9("servers", "list", "--api-url", url, env=env)
        assert code == 4 and "Traceback" not in err and err.strip().count("\n") == 0, (url, err)
        assert why in err and "--api-url" in err and "hunter2pass" not in err, (url, err)
    code, _, err = await z9("context", "set", "dev", "--api-url", "notaurl", "--token", "z9t_x", env=env)
    assert code != 0 and "notaurl" in err and "http:// or https://" in err and "Traceback" not in err, err
    assert not (tmp_path / "z9-config.toml").exists()
    code, _, err = await z9("context", "set", "dev", "--api-url", "http://127.0.0.1:8080/v1", "--token", "z9t_x", env=env)
    assert code == 0, err
