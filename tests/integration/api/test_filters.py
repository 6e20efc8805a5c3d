"""Issue 12 test 6: an unknown filter parameter answers 400; a label selector filters (every
resource type); name and status filters; a job page token stays valid after pruning."""
from __future__ import annotations

import pytest

from z9.common import labels, store

from tests.support import Stack


def test_the_documented_selector_pattern_agrees_with_the_parser() -> None:
    r"""``label_selector``'s pattern in the OpenAPI document accepts exactly what the parser does:
    strings drawn from the pattern parse, and random selector-like strings are accepted by both
    or by neither. Read with ``re.ASCII``, as schemathesis reads patterns: the space around the
    parts must be the same for every regex dialect (``\s`` is not — ECMA-262 adds U+FEFF, Rust
    U+0085, Python's ``str.strip`` U+001C-U+001F), so U+001C around a requirement was parsed,
    though the document refused it."""
    import re

    from hypothesis import HealthCheck, given, settings, strategies as st

    pattern = re.compile(labels.SELECTOR_PATTERN, re.ASCII)

    def parses(text: str) -> bool:
        try:
            labels.parse(text)
            return True
        except ValueError:
            return False

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.from_regex(pattern))
    def drawn_from_the_pattern(text: str) -> None:
        assert parses(text), text

    @settings(max_examples=300, deadline=None, database=None)
    @given(st.lists(st.sampled_from(["a", "b.c", "x/y", "-", "=", "==", "!=", "!", " ", ",", "in", " in ", "(", ")",
                                     "notin", "1", "\t", "é", "", "\x1c", "\x85", "\xa0", "\ufeff", "\u2028",
                                     "\x0b"]), max_size=12).map("".join))
    def selector_like(text: str) -> None:
        assert bool(pattern.fullmatch(text)) == parses(text), text

    drawn_from_the_pattern()
    selector_like()


def test_selector_parsing() -> None:
    s = labels.parse("env=prod, tier!=db,app,!legacy,zone in (a, b)")
    assert s.matches({"env": "prod", "app": "x", "zone": "a"})
    assert not s.matches({"env": "prod", "app": "x", "zone": "c"})
    assert not s.matches({"env": "prod", "app": "x", "zone": "a", "legacy": ""})
    assert not s.matches({"env": "prod", "app": "x", "zone": "a", "tier": "db"})
    assert labels.parse("env==prod").eq == {"env": "prod"}
    for bad in ("", "a=1,", "k notin (a)", "k in ()", "-x=1", "a in (b", "k=v v", "\x1ck=v", "k=v\x1f",
                "k\x85in (a)", "\xa0k", "k=\ufeffv"):
        with pytest.raises(ValueError):
            labels.parse(bad)


async def _labelled(api: Stack, name: str, lab: dict[str, str]) -> str:
    server, _ = await api.create_server(name)
    status, out = await api.call("PATCH", f"/servers/{server['id']}", json={"labels": lab})
    assert status == 200, out
    return server["id"]


async def test_label_selector_name_and_status_filters(api: Stack) -> None:
    a = await _labelled(api, "a", {"env": "prod", "tier": "web"})
    b = await _labelled(api, "b", {"env": "prod", "tier": "db"})
    c = await _labelled(api, "c", {"env": "dev"})
    d = await _labelled(api, "d", {})

    async def ids(query: str, path: str = "/servers", key: str = "servers") -> list[str]:
        status, out = await api.call("GET", f"{path}?{query}")
        assert status == 200, (query, out)
        return [x["id"] for x in out[key]]

    assert await ids("label_selector=env%3Dprod") == [a, b]
    assert await ids("label_selector=env%3Dprod,tier!%3Ddb") == [a]
    assert await ids("label_selector=tier!%3Ddb") == [a, c, d]  # without the key matches too
    assert await ids("label_selector=tier") == [a, b]
    assert await ids("label_selector=!tier") == [c, d]
    assert await ids("label_selector=env%20in%20(dev,%20prod),!tier") == [c]
    assert await ids("label_selector=env%3Dprod&limit=1") == [a]
    assert await ids("name=c") == [c]
    assert await ids("name=c&label_selector=env%3Dprod") == []
    await api.pool.execute("UPDATE servers SET status = 'running' WHERE id = ANY($1)", [a, c])
    assert await ids("status=running&label_selector=env") == [a, c]
    status, out = await api.call("GET", "/servers?label_selector=env%20notin%20(a)")
    assert status == 422 and out["error"]["details"][0]["field"] == "label_selector"
    status, out = await api.call("GET", "/servers?label_selector=a%3D%3Db%3D%3Dc")
    assert status == 422
    # an unknown filter is refused, never ignored (a script that filters and then deletes)
    status, out = await api.call("GET", "/servers?labels=env%3Dprod")
    assert status == 400 and "labels" in out["error"]["message"]
    # addresses: the same filters
    status, out = await api.call("POST", "/addresses", json={"region": "dev-1", "name": "lb"})
    adr = out["address"]["id"]
    status, out = await api.call("PATCH", f"/addresses/{adr}", json={"labels": {"role": "lb"}})
    assert status == 200 and out["address"]["labels"] == {"role": "lb"}
    await api.call("POST", "/addresses", json={"region": "dev-1", "name": "other"})
    assert await ids("label_selector=role%3Dlb", "/addresses", "addresses") == [adr]
    assert await ids("name=other&label_selector=!role", "/addresses", "addresses") != []


async def test_job_page_token_survives_pruning(api: Stack) -> None:
    made = [(await api.create_server(f"p-{i}"))[1]["id"] for i in range(4)]
    status, page = await api.call("GET", "/jobs?limit=2")
    assert status == 200 and [j["id"] for j in page["jobs"]] == made[:2]
    token = page["next_after"]
    assert token is not None and not token.startswith("job_")
    # the page's last job finishes and is pruned (retention 0)
    await api.pool.execute("UPDATE jobs SET status = 'failed', error = '{\"class\": \"permanent\", \"message\": \"x\"}', "
                           "finished_at = now() - interval '1 h' WHERE id = ANY($1)", made[:2])
    assert await store.job_prune_finished(api.pool, 1.0) == 2
    status, out = await api.call("GET", f"/jobs?limit=2&after={token}")
    assert status == 200, out
    assert [j["id"] for j in out["jobs"]] == made[2:]
    # a job id still works as `after` while the job exists; a pruned one is a clear 422
    status, out = await api.call("GET", f"/jobs?after={made[2]}")
    assert status == 200 and [j["id"] for j in out["jobs"]] == made[3:]
    status, out = await api.call("GET", f"/jobs?after={made[0]}")
    assert status == 422 and "page token" in out["error"]["message"]


async def test_page_tokens_are_opaque_and_only_the_api_makes_them(api: Stack) -> None:
    """``next_after`` does not reveal the platform-wide job count (it was ``pg_<base36 seq>``): a
    sealed block, different for each page and tenant; a token the API did not make for this
    tenant — a guessed position, a forged or altered one, another tenant's — is a 422 naming
    ``after``; every token matches the document's pattern."""
    import base64
    import re
    import struct

    from tests.support import make_tenant
    from z9.api.page_tokens import PATTERN

    made = [(await api.create_server(f"o-{i}"))[1]["id"] for i in range(5)]
    tokens = []
    after = ""
    for _ in range(2):
        status, page = await api.call("GET", f"/jobs?limit=2{after}")
        assert status == 200, page
        tokens.append(page["next_after"])
        after = f"&after={page['next_after']}"
    seq = await api.pool.fetchval("SELECT seq FROM jobs WHERE id = $1", made[1])
    for token in tokens:
        assert re.fullmatch(PATTERN, token), token
        raw = base64.urlsafe_b64decode(token.removeprefix("pg_") + "==")
        # the position is nowhere in clear (the old token was pg_<base36 seq>)
        assert struct.pack(">Q", seq) not in raw and struct.pack(">Q", seq + 2) not in raw, raw
    assert tokens[0][:10] != tokens[1][:10]  # not a counter: consecutive pages share no prefix
    status, out = await api.call("GET", f"/jobs?after={tokens[0]}")
    assert status == 200 and [j["id"] for j in out["jobs"]] == made[2:]
    forged = tokens[0][:-2] + ("AA" if tokens[0][-2:] != "AA" else "BA")
    _, other = await make_tenant(api.pool, "other-pages")
    for token, who in (("pg_1y2p0ij32e8e7", None), ("pg_0", None), (forged, None), ("pg_" + "A" * 22, None),
                       (tokens[0], other)):
        status, out = await api.call("GET", f"/jobs?after={token}", token=who)
        assert status == 422 and out["error"]["details"][0]["field"] == "after", (token, out)
    document = (await api.call("GET", "/openapi.json"))[1]
    params = {p["name"]: p for p in document["paths"]["/jobs"]["get"]["parameters"]}
    assert params["after"]["schema"]["pattern"].startswith(PATTERN)