"""The web console's sessions are server-side and opaque: the cookie holds a random session id,
never the API token; sign-out ends the session (a copy of the cookie stops working); the CSRF
token differs per session; the cookie is ``__Host-z9_console`` over HTTPS and a new session is
made at every sign-in (no fixation); a session dies with its token and after its idle time; and
sign-in, like Bearer authentication, goes through the failed-authentication limiter (a bad
session cookie counts too). In-process API, no browser."""
from __future__ import annotations

import asyncio
import logging
from http.cookies import SimpleCookie
from typing import Any, AsyncIterator

import asyncpg
import pytest

from z9.common import store
from z9.common.clock import TestClock
from z9.common.settings import Settings

from tests.support import Stack, api_stack


@pytest.fixture
async def web(settings: Settings, pool: asyncpg.Pool, clock: TestClock) -> AsyncIterator[Stack]:
    async with api_stack(settings.model_copy(update={"api_token_cache_s": 5.0, "console_session_idle_s": 3600.0,
                                                     "console_session_max_s": 86400.0}), pool, clock=clock) as s:
        yield s


@pytest.fixture
async def limited(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    """The failed-authentication limiter on: a bucket of 5, refilled so slowly it never refills
    within a test."""
    async with api_stack(settings.model_copy(update={"api_auth_failures_per_s": 0.001,
                                                     "api_auth_failure_burst": 5}), pool) as s:
        yield s


def root(stack: Stack) -> str:
    return stack.base.removesuffix("/v1")


async def raw(stack: Stack, method: str, path: str, *, cookie: str | None = None, name: str = "z9_console",
              headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any, Any]:
    """A request without Authorization (the console's way), with the session cookie if given."""
    h = dict(headers or {})
    if cookie is not None:
        h["Cookie"] = f"{name}={cookie}"
    async with stack.http.request(method, root(stack) + path, headers=h, **kw) as r:
        return r.status, await r.json(), r.headers


async def sign_in(stack: Stack, token: str, *, name: str = "z9_console",
                  **kw: Any) -> tuple[str, str, str]:
    """(session cookie, CSRF token, the raw Set-Cookie header)."""
    status, body, headers = await raw(stack, "POST", "/console/session", json={"token": token}, **kw)
    assert status == 200, body
    set_cookie = headers.get("Set-Cookie", "")
    jar: SimpleCookie = SimpleCookie()
    jar.load(set_cookie)
    return jar[name].value, body["csrf_token"], set_cookie


async def test_a_signed_out_console_cookie_no_longer_authenticates(web: Stack) -> None:
    status, out = await web.call("POST", "/tokens", json={"name": "session", "scopes": ["read", "write"]})
    assert status == 201, out
    cookie, csrf, _ = await sign_in(web, out["secret"])
    assert cookie != out["secret"] and out["secret"] not in cookie, "the console cookie holds the raw API token"
    assert cookie.startswith("z9s_")
    # only the session id's hash is stored
    assert await web.pool.fetchval("SELECT count(*) FROM console_sessions WHERE token_id = $1",
                                   out["token"]["id"]) == 1
    assert await web.pool.fetchval("SELECT count(*) FROM console_sessions s WHERE strpos(s::text, $1) > 0",
                                   cookie) == 0
    assert (await raw(web, "GET", "/v1/servers", cookie=cookie))[0] == 200
    # the cookie is no bearer token
    assert (await web.call("GET", "/servers", token=cookie))[0] == 401
    status, body, headers = await raw(web, "DELETE", "/console/session", cookie=cookie,
                                      headers={"X-CSRF-Token": csrf})
    assert status == 200, body
    assert "z9_console=" in headers.get("Set-Cookie", "")  # cleared in the browser too
    # a copy of the cookie taken before the sign-out
    status, body, _ = await raw(web, "GET", "/console/session", cookie=cookie)
    assert body == {"signed_in": False}, body
    status, body, _ = await raw(web, "GET", "/v1/servers", cookie=cookie)
    assert status == 401, (status, body)
    assert await web.pool.fetchval("SELECT revoked_at IS NOT NULL FROM console_sessions WHERE token_id = $1",
                                   out["token"]["id"])


async def test_sign_out_ends_the_session_on_another_api_process_within_the_cache_time(
        web: Stack, settings: Settings, pool: asyncpg.Pool, clock: TestClock) -> None:
    async with api_stack(web.settings, pool, clock=clock) as other:
        cookie, csrf, _ = await sign_in(web, web.token)
        assert (await raw(other, "GET", "/v1/servers", cookie=cookie))[0] == 200  # now cached there
        assert (await raw(web, "DELETE", "/console/session", cookie=cookie, headers={"X-CSRF-Token": csrf}))[0] == 200
        clock.step(web.settings.api_token_cache_s + 1)
        assert (await raw(other, "GET", "/v1/servers", cookie=cookie))[0] == 401


async def test_the_csrf_token_differs_between_sessions_of_one_token(web: Stack) -> None:
    first_cookie, first, _ = await sign_in(web, web.token)
    second_cookie, second, _ = await sign_in(web, web.token)
    assert first != second, "the CSRF token never rotates: one leak is good for the token's whole life"
    assert first_cookie != second_cookie
    body = {"name": "x", "scopes": ["read"]}
    # one session's CSRF token is no good in another session
    status, out, _ = await raw(web, "POST", "/v1/tokens", cookie=second_cookie, json=body,
                               headers={"X-CSRF-Token": first})
    assert status == 403 and out["error"]["code"] == "csrf_failed", out
    status, out, _ = await raw(web, "POST", "/v1/tokens", cookie=second_cookie, json=body,
                               headers={"X-CSRF-Token": second})
    assert status == 201, out
    status, out, _ = await raw(web, "GET", "/console/session", cookie=second_cookie)
    assert out["csrf_token"] == second and out["signed_in"] is True and "z9s_" not in str(out)


async def test_every_sign_in_makes_a_new_session_and_ends_the_one_it_came_with(web: Stack) -> None:
    """A session id planted in the browser before sign-in (fixation) is never the signed-in one."""
    planted, _, _ = await sign_in(web, web.token)  # the attacker's own session, planted in the victim's browser
    status, out = await web.call("POST", "/tokens", json={"name": "victim"})
    fresh, _, _ = await sign_in(web, out["secret"], cookie=planted)
    assert fresh != planted
    assert (await raw(web, "GET", "/console/session", cookie=planted))[1] == {"signed_in": False}
    status, me, _ = await raw(web, "GET", "/console/session", cookie=fresh)
    assert status == 200 and me["signed_in"] is True
    assert me["token_id"] == out["token"]["id"]


async def test_the_cookie_is_host_prefixed_over_https(web: Stack) -> None:
    https = {"X-Forwarded-Proto": "https"}
    cookie, csrf, set_cookie = await sign_in(web, web.token, name="__Host-z9_console", headers=https)
    attrs = [a.strip().lower() for a in set_cookie.split(";")]
    assert set_cookie.startswith("__Host-z9_console="), set_cookie
    assert "secure" in attrs and "path=/" in attrs and "httponly" in attrs and "samesite=strict" in attrs, attrs
    assert not [a for a in attrs if a.startswith("domain")], attrs
    status, _, _ = await raw(web, "GET", "/v1/servers", cookie=cookie, name="__Host-z9_console", headers=https)
    assert status == 200
    # over HTTPS a cookie without the prefix (which a sibling host could have set) is not read
    status, body, _ = await raw(web, "GET", "/console/session", cookie=cookie, headers=https)
    assert body == {"signed_in": False}
    status, _, headers = await raw(web, "DELETE", "/console/session", cookie=cookie, name="__Host-z9_console",
                                   headers={**https, "X-CSRF-Token": csrf})
    assert status == 200 and headers["Set-Cookie"].startswith("__Host-z9_console=") and "Secure" in headers["Set-Cookie"]
    # plain http keeps the plain name, not Secure (z9 dev)
    _, _, set_cookie = await sign_in(web, web.token)
    assert set_cookie.startswith("z9_console=") and "Secure" not in set_cookie


async def test_a_session_dies_with_its_token_and_after_its_idle_time(web: Stack, clock: TestClock) -> None:
    status, out = await web.call("POST", "/tokens", json={"name": "short"})
    assert status == 201, out
    cookie, _, _ = await sign_in(web, out["secret"])
    assert (await raw(web, "GET", "/v1/servers", cookie=cookie))[0] == 200
    assert (await web.call("DELETE", f"/tokens/{out['token']['id']}"))[0] == 200
    assert (await raw(web, "GET", "/v1/servers", cookie=cookie))[0] == 401  # at once on this process
    assert (await raw(web, "GET", "/console/session", cookie=cookie))[1] == {"signed_in": False}

    cookie, _, _ = await sign_in(web, web.token)
    clock.step(web.settings.console_session_idle_s / 2)
    assert (await raw(web, "GET", "/v1/servers", cookie=cookie))[0] == 200  # used: its expiry moves on
    clock.step(web.settings.console_session_idle_s * 0.75)
    assert (await raw(web, "GET", "/v1/servers", cookie=cookie))[0] == 200
    clock.step(web.settings.console_session_idle_s + 1)  # idle longer than the cap
    assert (await raw(web, "GET", "/v1/servers", cookie=cookie))[0] == 401
    # however used, a session ends console_session_max_s after sign-in
    cookie, _, _ = await sign_in(web, web.token)
    step = web.settings.console_session_idle_s * 0.9
    used = 0.0
    while used + step < web.settings.console_session_max_s:
        clock.step(step)
        used += step
        assert (await raw(web, "GET", "/v1/servers", cookie=cookie))[0] == 200, used
    clock.step(step)
    assert (await raw(web, "GET", "/v1/servers", cookie=cookie))[0] == 401


async def test_console_sign_in_is_limited_like_bearer_authentication(limited: Stack) -> None:
    assert (await limited.call("GET", "/servers"))[0] == 200  # now in this process's token cache
    statuses = [(await raw(limited, "POST", "/console/session", json={"token": f"z9t_bad{i}"}))[0]
                for i in range(8)]
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}, statuses
    status, _, headers = await raw(limited, "POST", "/console/session", json={"token": "z9t_bad"})
    assert status == 429 and int(headers["Retry-After"]) > 0
    # the same bucket as Bearer authentication
    assert (await limited.call("GET", "/servers", token="z9t_bad"))[0] == 429
    assert (await limited.call("GET", "/servers"))[0] == 200  # a token this process knows still works


async def test_a_bad_session_cookie_counts_as_a_failed_authentication(limited: Stack) -> None:
    statuses = [(await raw(limited, "GET", "/console/session", cookie=f"z9s_{'x' * 42}{i}"))[0] for i in range(5)]
    assert statuses == [200] * 5  # {"signed_in": false}, each spending from the bucket
    status, body, _ = await raw(limited, "GET", "/v1/servers", cookie="z9s_forged")
    assert status == 429, body
    assert (await raw(limited, "POST", "/console/session", json={"token": "z9t_bad"}))[0] == 429
    assert (await raw(limited, "GET", "/console/session", cookie="z9s_forged"))[0] == 429
    assert (await raw(limited, "DELETE", "/console/session", cookie="z9s_forged"))[0] == 429


async def test_the_session_id_appears_in_no_log_line(web: Stack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    cookie, csrf, _ = await sign_in(web, web.token)
    await raw(web, "GET", "/v1/servers", cookie=cookie)
    await raw(web, "POST", "/v1/tokens", cookie=cookie, json={"name": "y"})  # refused: no CSRF token
    await raw(web, "DELETE", "/console/session", cookie=cookie, headers={"X-CSRF-Token": csrf})
    await raw(web, "GET", "/v1/servers", cookie=cookie)
    assert caplog.records
    assert cookie not in caplog.text and csrf not in caplog.text
    assert await store.api_token_auth(web.pool, cookie) is None


async def test_ended_sessions_are_pruned_after_a_day(web: Stack, clock: TestClock) -> None:
    ended, csrf, _ = await sign_in(web, web.token)
    assert (await raw(web, "DELETE", "/console/session", cookie=ended, headers={"X-CSRF-Token": csrf}))[0] == 200
    await sign_in(web, web.token)  # a live one, kept
    assert await store.console_session_prune(web.pool, 86400, now=clock.now()) == 0
    clock.step(86400 + 60)
    assert await store.console_session_prune(web.pool, 86400, now=clock.now()) == 1  # the signed-out one
    clock.step(web.settings.console_session_idle_s + 86400)
    assert await store.console_session_prune(web.pool, 86400, now=clock.now()) == 1  # the expired one
    assert await web.pool.fetchval("SELECT count(*) FROM console_sessions") == 0


async def test_the_session_names_its_tenant(web: Stack) -> None:
    """The console shows the tenant by the name people know it by, not its id."""
    cookie, _, _ = await sign_in(web, web.token)
    status, me, _ = await raw(web, "GET", "/console/session", cookie=cookie)
    assert status == 200 and me["tenant"] == web.tenant_id and me["tenant_name"] == "acme", me


async def raw_bytes(stack: Stack, method: str, path: str, header: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """A request whose header line is sent as these exact bytes (no client library re-encodes
    them): the status and body of its answer."""
    from urllib.parse import urlsplit

    url = urlsplit(root(stack))
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n".encode() + header
                     + b"\r\n" + (b"Content-Type: application/json\r\n" if body else b"")
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


async def test_undecodable_credentials_are_failed_authentications_not_errors(limited: Stack) -> None:
    """Bytes that are no UTF-8 in the Authorization header or the session cookie, and a lone
    surrogate in a sign-in token, are refused as unknown credentials (401, spending from the
    failed-authentication bucket), never a 500."""
    attempts = [("GET", "/v1/servers", b"Authorization: Bearer \xff", b""),
                ("GET", "/v1/servers", b"Authorization: Bearer z9t_\xff\xfe", b""),
                ("GET", "/console/session", b"Cookie: z9_console=z9s_\xff\xfe", b""),
                ("GET", "/v1/servers", b"Cookie: z9_console=z9s_\xff\xfe", b""),
                ("POST", "/console/session", b"X-Z9: 1", b'{"token": "z9t_\\udcff"}')]
    statuses = []
    for method, path, header, body in attempts:
        status, answer = await raw_bytes(limited, method, path, header, body)
        statuses.append(status)
        assert status != 500, answer
    # the session read says "not signed in" (200); the others refuse (401): five failures spent
    assert statuses == [401, 401, 200, 401, 401], statuses
    for method, path, header, body in attempts:
        assert (await raw_bytes(limited, method, path, header, body))[0] == 429
