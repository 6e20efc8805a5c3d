"""Token lineage and the limits every token of a tenant shares: a token never outlives the token
that made it (its expiry capped, refused past it; an ancestor's expiry or revocation ends it),
revoking a token revokes everything it made, transitively; the rate limit is the tenant's, not the
token's; failed authentications are limited per client address (an IPv6 one by its /64) without a
database lookup each — yet a token z9 minted (its tag verifies) is still looked up, so another's
bad tokens never lock a valid token out of a shared address."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator

import asyncpg
import pytest

from z9.api.middleware import RATE_LIMITS
from z9.api.tokens import AUTH_FAILURES, CACHE, client_key, new_secret, tag_verdict, token_tag_key
from z9.common import store
from z9.common.settings import Settings

from tests.support import Stack, api_stack, make_tenant
from tests.integration.security.test_tokens import call


async def _make(api: Stack, parent: str, name: str, **body: Any) -> tuple[int, Any]:
    status, out, _ = await call(api, "POST", "/tokens", parent, json={"name": name, **body})
    return status, out


@pytest.fixture
async def nocache(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    """The API looking every token up (no cache): what the database says is what answers."""
    async with api_stack(settings.model_copy(update={"api_token_cache_s": 0}), pool) as stack:
        yield stack


async def test_a_child_never_outlives_its_parent(nocache: Stack) -> None:
    api = nocache
    status, out = await _make(api, api.token, "short", expires_in_s=120)
    assert status == 201, out
    short, short_exp = out["secret"], datetime.fromisoformat(out["token"]["expires_at"])
    # no expiry asked for: it gets its parent's (it had none before: it outlived its parent)
    status, out = await _make(api, short, "child")
    assert status == 201, out
    child = out["secret"]
    assert datetime.fromisoformat(out["token"]["expires_at"]) == short_exp
    assert out["token"]["created_by"] == (await store.api_token_auth(api.pool, short))["id"]
    # longer than the parent: refused, naming expires_in_s
    status, out = await _make(api, short, "long", expires_in_s=3600)
    assert status == 422 and out["error"]["details"][0]["field"] == "expires_in_s", out
    # shorter is fine
    status, out = await _make(api, short, "shorter", expires_in_s=60)
    assert status == 201, out
    # the parent expires (its row moved into the past): the child stops with it, even one whose own
    # row says it lives on (made before the lineage rule: written here by hand)
    legacy_id = await api.pool.fetchval("SELECT id FROM api_tokens WHERE name = 'child'")
    await api.pool.execute("UPDATE api_tokens SET expires_at = NULL WHERE id = $1", legacy_id)
    assert (await call(api, "GET", "/servers", child))[0] == 200
    await api.pool.execute("UPDATE api_tokens SET expires_at = now() - interval '1 s' WHERE name = 'short'")
    assert (await call(api, "GET", "/servers", child))[0] == 401
    assert (await call(api, "GET", "/servers", short))[0] == 401


async def test_revoking_a_token_revokes_everything_it_made(nocache: Stack) -> None:
    api = nocache
    _, a = await _make(api, api.token, "a")
    _, b = await _make(api, a["secret"], "b")
    _, c = await _make(api, b["secret"], "c")
    _, sibling = await _make(api, api.token, "sibling")
    for t in (a, b, c, sibling):
        assert (await call(api, "GET", "/servers", t["secret"]))[0] == 200
    status, out, _ = await call(api, "DELETE", f"/tokens/{a['token']['id']}")
    assert status == 200 and out["token"]["id"] == a["token"]["id"] and out["token"]["revoked_at"], out
    for t in (a, b, c):
        assert (await call(api, "GET", "/servers", t["secret"]))[0] == 401, t["token"]["name"]
    assert (await call(api, "GET", "/servers", sibling["secret"]))[0] == 200
    _, listed, _ = await call(api, "GET", "/tokens?include_revoked=true")
    by_name = {t["name"]: t for t in listed["tokens"]}
    assert by_name["b"]["revoked_at"] and by_name["c"]["revoked_at"] and not by_name["sibling"]["revoked_at"]
    assert by_name["c"]["created_by"] == b["token"]["id"] and by_name["b"]["created_by"] == a["token"]["id"]
    # another tenant cannot revoke this tenant's tokens (404), nor reach them through its own
    _, other = await make_tenant(api.pool, "other")
    assert (await call(api, "DELETE", f"/tokens/{sibling['token']['id']}", other))[0] == 404
    assert (await call(api, "GET", "/servers", sibling["secret"]))[0] == 200


async def test_revocation_on_a_cached_process_ends_the_children_at_once(api: Stack) -> None:
    """With the token cache on, the revoking process forgets the children too (not only the token)."""
    _, a = await _make(api, api.token, "a")
    _, b = await _make(api, a["secret"], "b")
    assert (await call(api, "GET", "/servers", b["secret"]))[0] == 200     # b now cached
    assert (await call(api, "DELETE", f"/tokens/{a['token']['id']}"))[0] == 200
    assert (await call(api, "GET", "/servers", b["secret"]))[0] == 401


@pytest.fixture
async def limited(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    async with api_stack(settings.model_copy(update={
            "api_rate_limit_per_s": 1.0, "api_rate_limit_burst": 30,
            "api_auth_failures_per_s": 0.5, "api_auth_failure_burst": 10}), pool) as stack:
        yield stack


async def test_twenty_tokens_of_one_tenant_share_one_rate_limit(limited: Stack) -> None:
    api = limited
    now = [1000.0]
    api.app[RATE_LIMITS].clock = lambda: now[0]
    tokens = [api.token]
    for i in range(19):
        status, out = await _make(api, api.token, f"t{i}")
        assert status == 201, out
        tokens.append(out["secret"])
    # 19 creations spent 19 of the tenant's 30; 11 left whichever token asks
    answers = [(await call(api, "GET", "/servers", tokens[i % 20]))[0] for i in range(20)]
    assert answers == [200] * 11 + [429] * 9, answers
    status, out, headers = await call(api, "GET", "/servers", tokens[19])
    assert status == 429 and out["error"]["code"] == "rate_limited" and int(headers["Retry-After"]) >= 1
    # another tenant is not affected
    _, other = await make_tenant(api.pool, "other")
    assert (await call(api, "GET", "/servers", other))[0] == 200
    now[0] += int(headers["Retry-After"])
    assert (await call(api, "GET", "/servers", tokens[7]))[0] == 200


async def test_failed_authentication_is_limited_per_address_without_a_lookup(limited: Stack,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    api = limited
    now = [1000.0]
    api.app[AUTH_FAILURES].clock = lambda: now[0]
    lookups = []
    real = store.api_token_auth

    async def counting(db: Any, token: str, **kw: Any) -> Any:
        lookups.append(token)
        return await real(db, token, **kw)
    monkeypatch.setattr(store, "api_token_auth", counting)
    assert (await call(api, "GET", "/servers", api.token))[0] == 200     # known (cached) from here on
    lookups.clear()
    statuses = [(await call(api, "GET", "/servers", f"z9t_bad{i}"))[0] for i in range(200)]
    assert statuses == [401] * 10 + [429] * 190, statuses
    assert len(lookups) == 10                                   # none once the address is limited
    status, out, headers = await call(api, "GET", "/servers", "z9t_bad")
    assert status == 429 and out["error"]["code"] == "rate_limited" and int(headers["Retry-After"]) == 2
    # a token this process knows (cached) still works from that address
    assert (await call(api, "GET", "/servers", api.token))[0] == 200
    # after Retry-After: one more try
    now[0] += 2
    assert (await call(api, "GET", "/servers", "z9t_bad"))[0] == 401
    assert (await call(api, "GET", "/servers", "z9t_bad"))[0] == 429


async def test_a_limited_address_still_authenticates_the_tokens_z9_minted(limited: Stack,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind one NAT or ingress, one client's flood of bad tokens limits the address; another
    tenant's valid token (tagged: minted by z9) presented from it is still looked up and answers,
    while forged tags, untagged junk and a dead tagged token seen once cost no lookup."""
    api = limited
    now = [1000.0]
    api.app[AUTH_FAILURES].clock = lambda: now[0]
    lookups: list[str] = []
    real = store.api_token_auth

    async def counting(db: Any, token: str, **kw: Any) -> Any:
        lookups.append(token)
        return await real(db, token, **kw)
    monkeypatch.setattr(store, "api_token_auth", counting)
    key = token_tag_key(api.settings)
    assert key is not None
    theirs = new_secret(key)        # what POST /v1/tokens and `z9 token` mint
    await store.api_token_insert(api.pool, await store.tenant_upsert(api.pool, "neighbour"), theirs)
    status, made = await _make(api, api.token, "minted")
    assert status == 201 and tag_verdict(key, made["secret"]) is True, made
    statuses = [(await call(api, "GET", "/servers", f"z9t_bad{i}"))[0] for i in range(40)]
    assert statuses == [401] * 10 + [429] * 30, statuses
    lookups.clear()
    # forged: the tagged form, a tag that does not verify — no lookup
    body = theirs[4:47]
    forged = [f"z9t_{body}.{'A' * 22}", f"z9t_{'x' * 43}.{theirs[-22:]}"]
    assert [tag_verdict(key, f) for f in forged] == [False, False]
    assert [(await call(api, "GET", "/servers", f))[0] for f in forged] == [429, 429] and lookups == []
    # the neighbour's valid token and the tenant's new one, never seen by this process: looked up, answered
    assert (await call(api, "GET", "/servers", theirs))[0] == 200
    assert (await call(api, "GET", "/servers", made["secret"]))[0] == 200
    assert lookups == [theirs, made["secret"]]
    # a tagged token revoked: looked up once (401), then refused without a lookup
    status, out, _ = await call(api, "DELETE", f"/tokens/{made['token']['id']}", api.token)
    assert status in (200, 204), out
    api.app[CACHE].clear()
    lookups.clear()
    assert (await call(api, "GET", "/servers", made["secret"]))[0] == 401
    assert (await call(api, "GET", "/servers", made["secret"]))[0] == 429
    assert lookups == [made["secret"]]
    # a token from before tags (untagged) is limited with the address, as before
    _, old = await make_tenant(api.pool, "legacy")
    assert tag_verdict(key, old) is None
    assert (await call(api, "GET", "/servers", old))[0] == 429


def test_failed_authentication_buckets_key_ipv6_by_its_64() -> None:
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:ffff:1:2:3") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("198.51.100.7") == client_key("::ffff:198.51.100.7") == "198.51.100.7"
    assert client_key("fe80::1%eth0") == "fe80::/64" and client_key(None) == "unknown"
