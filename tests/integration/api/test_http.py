"""HTTP as clients expect: Location on 202, Allow on 405, WWW-Authenticate on 401, X-Request-Id
(echoed or made, in log lines, on jobs), unknown query parameters refused, rate limits per token
with the RateLimit headers, and requests aiohttp's parser rejects answered in the JSON shape."""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, AsyncIterator

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from z9.api.middleware import RATE_LIMITS, TokenBuckets, request_id_middleware
from z9.common.logs import JobContextFilter
from z9.common.settings import Settings

from tests.support import REGION, Stack, api_stack, make_tenant

BODY = {"name": "h1", "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 1024, "disk_gib": 10}


async def req(api: Stack, method: str, path: str, *, headers: dict[str, str] | None = None, auth: bool = True,
              **kw: Any) -> tuple[int, Any, Any]:
    h = {**(api.headers() if auth else {}), **(headers or {})}
    async with api.http.request(method, api.base + path, headers=h, **kw) as r:
        return r.status, await r.json(), r.headers


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.addFilter(JobContextFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def captured() -> Any:
    cap = Capture()
    root = logging.getLogger()
    old = root.level
    root.addHandler(cap)
    root.setLevel(logging.DEBUG)
    yield cap
    root.removeHandler(cap)
    root.setLevel(old)


async def test_location_on_every_202(api: Stack) -> None:
    status, out, headers = await req(api, "POST", "/servers", json=BODY)
    assert status == 202 and headers["Location"] == f"/v1/jobs/{out['job']['id']}"
    sid = out["server"]["id"]
    status, out, headers = await req(api, "DELETE", f"/servers/{sid}")
    assert status == 202 and headers["Location"] == f"/v1/jobs/{out['job']['id']}"
    status, out, headers = await req(api, "POST", f"/servers/{sid}/actions/cancel-deletion")
    assert status == 202 and headers["Location"] == f"/v1/jobs/{out['job']['id']}"
    # and the Location is a working job URL
    async with api.http.get(api.base.removesuffix("/v1") + headers["Location"], headers=api.headers()) as r:
        assert r.status == 200 and (await r.json())["id"] == out["job"]["id"]


async def test_allow_on_405_and_www_authenticate_on_401(api: Stack) -> None:
    status, out, headers = await req(api, "PUT", "/servers")
    assert status == 405 and set(out) == {"error"}
    assert set(headers["Allow"].split(",")) == {"GET", "HEAD", "POST"}
    status, out, headers = await req(api, "PATCH", "/jobs/job_00000000000000000000000000")
    assert status == 405 and set(headers["Allow"].split(",")) == {"GET", "HEAD"}
    status, out, headers = await req(api, "GET", "/servers", auth=False)
    assert status == 401 and headers["WWW-Authenticate"] == 'Bearer realm="z9"'
    status, out, headers = await req(api, "GET", "/servers", headers={"Authorization": "Bearer nope"}, auth=False)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")


async def test_request_id_echoed_made_and_stored(api: Stack) -> None:
    status, out, headers = await req(api, "POST", "/servers", json=BODY, headers={"X-Request-Id": "my-req-1"})
    assert status == 202 and headers["X-Request-Id"] == "my-req-1"
    job = await api.job(out["job"]["id"])
    assert job["request_id"] == "my-req-1"
    assert await api.pool.fetchval("SELECT request_id FROM jobs WHERE id = $1", job["id"]) == "my-req-1"
    for given in (None, "x" * 201, "has space"):
        status, _, headers = await req(api, "GET", "/servers", headers={"X-Request-Id": given} if given else None)
        assert status == 200 and re.fullmatch(r"req_[0-9a-f]{24}", headers["X-Request-Id"]), headers
    # errors carry it too
    status, _, headers = await req(api, "GET", "/servers/srv_00000000000000000000000000",
                                   headers={"X-Request-Id": "e-1"})
    assert status == 404 and headers["X-Request-Id"] == "e-1"


async def test_request_id_is_on_every_log_line_of_the_request(captured: Capture) -> None:
    async def handler(request: web.Request) -> web.Response:
        logging.getLogger("z9.api").info("inside")
        await asyncio.sleep(0)
        logging.getLogger("z9.executor").warning("still inside")
        return web.json_response({})

    # aiohttp serves each request in a task of its own, as here
    await asyncio.create_task(request_id_middleware(
        make_mocked_request("GET", "/v1/servers", headers={"X-Request-Id": "abc"}), handler))
    inside = [r for r in captured.records if r.getMessage() in ("inside", "still inside")]
    assert len(inside) == 2 and all(r.request_id == "abc" for r in inside)  # type: ignore[attr-defined]
    captured.records.clear()
    logging.getLogger("z9.api").info("outside")  # another context: no request id
    assert not hasattr(captured.records[-1], "request_id")


async def test_unknown_query_parameters_answer_400_naming_them(api: Stack) -> None:
    srv, job = await api.create_server("q1")
    for path, names in (("/servers?stauts=running", ["stauts"]), ("/servers?status=running&label=a&x=1", ["label", "x"]),
                        ("/jobs?resource=srv_x", ["resource"]), (f"/jobs/{job['id']}?wait=3", ["wait"]),
                        ("/servers/srv_00000000000000000000000000?verbose=1", ["verbose"]),
                        ("/tokens?all=1", ["all"]), ("/addresses?regoin=dev-1", ["regoin"]),
                        ("/addresses/adr_00000000000000000000000000?verbose=1", ["verbose"])):
        status, out, _ = await req(api, "GET", path)
        assert status == 400, (path, out)
        assert out["error"]["code"] == "unknown_parameter"
        assert [d["field"] for d in out["error"]["details"]] == names
        for n in names:
            assert n in out["error"]["message"]
    status, out, _ = await req(api, "DELETE", "/servers/srv_00000000000000000000000000?force=true")
    assert status == 400 and "force" in out["error"]["message"]
    for method, path in (("PATCH", "/addresses/adr_00000000000000000000000000?force=1"),
                         ("POST", "/addresses/adr_00000000000000000000000000/actions/assign?force=1"),
                         ("POST", "/addresses?dry_run=1")):
        status, out, _ = await req(api, method, path, json={"region": "dev-1"})
        assert status == 400 and out["error"]["code"] == "unknown_parameter", (method, path, out)
    # declared ones pass
    for path in ("/servers?status=running&limit=5", f"/jobs?resource_id={job['id']}&limit=1",
                 f"/jobs/{job['id']}?wait_s=0", "/tokens?include_revoked=true",
                 f"/addresses?region=dev-1&server_id={srv['id']}&status=creating&limit=5"):
        status, out, _ = await req(api, "GET", path)
        assert status == 200, (path, out)


@pytest.fixture
async def limited(settings: Settings, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    async with api_stack(settings.model_copy(update={"api_rate_limit_per_s": 2.0, "api_rate_limit_burst": 3}),
                         pool) as stack:
        yield stack


async def test_rate_limit_per_token(limited: Stack) -> None:
    # The buckets' clock stands still unless moved: on the real one, a loaded machine took over
    # 0.5 s (one unit back at 2/s) for these requests and the registry read, and the 4th got 200.
    now = [1000.0]
    limited.app[RATE_LIMITS].clock = lambda: now[0]
    seen = []
    for _ in range(3):
        status, _, headers = await req(limited, "GET", "/servers")
        assert status == 200
        assert headers["RateLimit-Policy"] == '"token";q=3;w=2'
        seen.append(headers["RateLimit"])
    assert seen[0].startswith('"token";r=2;') and seen[2].startswith('"token";r=0;')
    from prometheus_client import REGISTRY

    limited0 = REGISTRY.get_sample_value("z9_api_rate_limited_total") or 0
    status, out, headers = await req(limited, "GET", "/servers")
    assert status == 429 and out["error"]["code"] == "rate_limited"
    assert REGISTRY.get_sample_value("z9_api_rate_limited_total") == limited0 + 1
    assert int(headers["Retry-After"]) >= 1 and headers["RateLimit"].startswith('"token";r=0;')
    # another token has its own bucket
    _, other = await make_tenant(limited.pool, "other")
    assert (await req(limited, "GET", "/servers", headers={"Authorization": f"Bearer {other}"}, auth=False))[0] == 200
    # after Retry-After, the token works again
    now[0] += int(headers["Retry-After"])
    assert (await req(limited, "GET", "/servers"))[0] == 200


def test_token_bucket_refills_at_its_rate() -> None:
    b = TokenBuckets(per_s=2, burst=4)
    assert [b.take("t", now=0)[0] for _ in range(5)] == [True] * 4 + [False]
    assert b.take("t", now=0.49)[0] is False
    assert b.take("t", now=0.5 + 0.01)[0] is True  # one unit back after 0.5 s
    assert b.take("t", now=100)[1] == 3  # never above the burst
    assert b.retry_after(0.0) == 1 and TokenBuckets(0.1, 1).retry_after(0.0) == 10
    assert not TokenBuckets(0, 10).enabled


async def _raw(api: Stack, data: bytes) -> tuple[int, bytes]:
    host, port = re.match(r"http://([^:]+):(\d+)", api.base).groups()  # type: ignore[union-attr]
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def test_malformed_requests_get_the_json_error_and_one_log_line(api: Stack, captured: Capture) -> None:
    import json

    from z9.api.waiting import WAITERS

    # The API's job waiters log once when their LISTEN is up: let that happen before counting lines.
    assert await api.app[WAITERS].wait_listening(30)
    for data in (b"GET /v1/\xff HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"GET /v1/servers HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n",
                 b"GET /v1/servers HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n"):
        captured.records.clear()
        status, body = await _raw(api, data)
        assert status == 400, (data, body)
        out = json.loads(body)
        assert set(out) == {"error"} and out["error"]["code"] == "bad_request", out
        assert out["error"]["message"].startswith("malformed HTTP request")
        lines = [r for r in captured.records if r.name in ("z9.api", "aiohttp.server")]
        assert len(lines) == 1 and lines[0].levelno == logging.WARNING and not lines[0].exc_info, \
            [(r.name, r.levelname, r.getMessage()) for r in lines]


async def test_an_api_process_opens_at_most_z9_api_pool_size_connections(settings: Settings) -> None:
    """``Z9_API_POOL_SIZE`` is the size of the API's own pool (an operator's connection budget),
    and requests beyond it wait for a connection instead of failing: 40 concurrent requests
    through a pool of 3 all answer 200."""
    import aiohttp
    from aiohttp.test_utils import TestServer

    from z9.api.app import create_app
    from z9.api.resources import POOL

    app = create_app(settings.model_copy(update={"api_pool_size": 3}))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        assert app[POOL].get_max_size() == 3
        async with aiohttp.ClientSession() as http:
            async def ready() -> int:
                async with http.get(server.make_url("/healthz")) as r:
                    return r.status
            assert set(await asyncio.gather(*(ready() for _ in range(40)))) == {200}
        assert app[POOL].get_size() <= 3
    finally:
        await server.close()
