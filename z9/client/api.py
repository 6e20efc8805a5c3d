"""A typed Python client of the z9 REST API (``/v1``)::

    from z9.client import Client, ServerCreate

    c = Client("http://127.0.0.1:8080/v1", token)
    accepted = c.create_server(ServerCreate(name="web-1", region="dev-1", image="debian-12",
                                            cores=2, memory_mib=2048, disk_gib=20))
    job = c.wait_job(accepted.job.id, timeout_s=1800)       # long-poll, not a sleep loop
    if job.status == "failed":
        print(job.error.message)

- **Retries**: a 503 (database away) or 429 (rate limit) is retried after its ``Retry-After``
  (capped at ``max_retry_wait_s``), and so is a connection that failed before any answer; at most
  ``max_retries`` times. A POST is retried only with an ``Idempotency-Key``, which the client
  puts on every POST it may retry (one key per call, the same on each retry), so a retry can
  never create a second server. ``POST /tokens`` is never retried (the API keeps no copy of its
  answer).
- **Errors**: an answer ≥ 400 raises :class:`ApiError` (``status``, ``code``, ``message``,
  ``details``); 409 raises :class:`Conflict` (a failed precondition: never retried).
- **Waiting**: :meth:`Client.wait_job` loops on ``GET /jobs/{id}?wait_s=…``, calling
  ``on_change(job)`` on every answer that changed something; it returns the terminal job or
  raises :class:`Deadline`.
"""
from __future__ import annotations

import email.utils
import random
import secrets
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterator

import requests

from .config import masked_url

from .models import (ADDRESSES, CLUSTERS, LOAD_BALANCERS, SERVERS, Accepted, Address, Cluster, Job, Kubeconfig, Plan,
                     LoadBalancer, Page, Quota, ResourceKind, Server, ServerCreate, Token, TokenCreate, TokenCreated)

USER_AGENT = "z9-client/1"


class ApiError(Exception):
    """The API refused a request (status ≥ 400), or could not be reached (``status`` 0)."""

    def __init__(self, status: int, code: str, message: str, details: Any = None,
                 headers: dict[str, str] | None = None):
        super().__init__(f"{status} {code}: {message}" if status else message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers or {}


class Conflict(ApiError):
    """409: a precondition failed (the message names it). Retrying the same request does not help."""


class Unreachable(ApiError):
    """No answer from the API (connection refused, reset, timed out) after the retries."""


class Deadline(Exception):
    """:meth:`Client.wait_job` ran out of time; ``job`` is the job as last seen."""

    def __init__(self, job: Job, timeout_s: float):
        super().__init__(f"job {job.id} is still {job.status} after {timeout_s:g}s")
        self.job = job
        self.timeout_s = timeout_s


def retry_after_s(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delay-seconds or an HTTP date); None if absent or
    unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _why(e: requests.RequestException) -> str:
    """Why a request got no answer, in a few words: the socket's own reason ("Connection refused",
    "Name or service not known") or the timeout — not urllib3's whole retry chain."""
    if isinstance(e, requests.Timeout):
        return "no answer in time (timed out)"
    seen: set[int] = set()
    stack: list[BaseException] = [e]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.strerror:
            return x.strerror
        stack.extend(a for a in getattr(x, "args", ()) if isinstance(a, BaseException))
        for nxt in (getattr(x, "reason", None), x.__cause__, x.__context__):
            if isinstance(nxt, BaseException):
                stack.append(nxt)
    return "connection failed"


class Client:
    """The z9 API at ``api_url`` (``…/v1``) as ``token``. ``sleep`` and ``session`` can be
    replaced (tests)."""

    RETRY_STATUSES = frozenset({429, 503})

    def __init__(self, api_url: str, token: str, *, max_retries: int = 5, max_retry_wait_s: float = 60.0,
                 request_timeout_s: float = 30.0, session: requests.Session | None = None,
                 sleep: Callable[[float], None] = time.sleep):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.max_retries = max_retries
        self.max_retry_wait_s = max_retry_wait_s
        self.request_timeout_s = request_timeout_s
        self.session = session or requests.Session()
        self.sleep = sleep
        self.retries = 0  # retried requests so far (tests)

    # ------------------------------------------------------------------ transport

    def request(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None,
                retry: bool = True, timeout_s: float | None = None) -> tuple[int, Any, dict[str, str]]:
        """One API call: (status, JSON body, headers) of a successful answer; raises
        :class:`ApiError` / :class:`Conflict` / :class:`Unreachable` otherwise. See the module
        docstring for what is retried."""
        headers = {"Authorization": f"Bearer {self.token}", "User-Agent": USER_AGENT, "Accept": "application/json"}
        if method == "POST" and retry:
            headers["Idempotency-Key"] = "z9c-" + secrets.token_hex(16)
        params = {k: v for k, v in (params or {}).items() if v is not None}
        attempt = 0
        while True:
            try:
                r = self.session.request(method, self.api_url + path, json=json, params=params, headers=headers,
                                         timeout=timeout_s or self.request_timeout_s)
            except (requests.ConnectionError, requests.Timeout) as e:
                if not retry or attempt >= self.max_retries:
                    raise Unreachable(0, "unreachable", f"cannot reach the z9 API at {masked_url(self.api_url)}: {_why(e)}") from e
                attempt += 1
                self.retries += 1
                self.sleep(self._backoff(attempt))
                continue
            except requests.RequestException as e:  # a URL requests cannot use: no retry helps
                raise Unreachable(0, "unreachable", f"cannot use the z9 API URL {masked_url(self.api_url)}: "
                                  f"{masked_url(str(e))}") from e
            if r.status_code in self.RETRY_STATUSES and retry and attempt < self.max_retries:
                attempt += 1
                self.retries += 1
                wait = retry_after_s(r.headers.get("Retry-After"))
                self.sleep(min(self.max_retry_wait_s, wait if wait is not None else self._backoff(attempt)))
                continue
            return self._answer(r)

    @staticmethod
    def _backoff(attempt: int) -> float:
        return min(10.0, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.75, 1.25)

    @staticmethod
    def _answer(r: requests.Response) -> tuple[int, Any, dict[str, str]]:
        try:
            body = r.json()
        except ValueError:
            body = None
        headers = dict(r.headers)
        if r.status_code < 400:
            return r.status_code, body, headers
        err = body.get("error") if isinstance(body, dict) else None
        if not isinstance(err, dict):
            err = {"code": "http_error", "message": (r.text or r.reason or "").strip()[:500]}
            if r.status_code == 404:  # not z9's own 404 (which names what is missing): not its API there
                base = r.url.split("?")[0]
                err["message"] = (f"nothing answers {base} as the z9 API does (404 {err['message'] or 'Not Found'}): "
                                  "the API URL ends in /v1, e.g. http://127.0.0.1:8080/v1 (--api-url, Z9_API_URL "
                                  "or the context's)")
        cls = Conflict if r.status_code == 409 else ApiError
        raise cls(r.status_code, str(err.get("code")), str(err.get("message")), err.get("details"), headers)

    # ------------------------------------------------------------------ any resource kind
    # The REST shape every resource type shares (services/api/z9/api/resources.py): create, list, get,
    # delete, cancel-deletion, PATCH and POST …/actions/NAME, each answering {<name>: …, "job": …}.

    def _accepted(self, kind: ResourceKind[Any], out: dict[str, Any]) -> Accepted[Any]:
        extra = {k: v for k, v in out.items() if k not in (kind.name, "job", "key", "resource")}  # e.g. "jobs"
        return Accepted[kind.model](resource=out[kind.name], job=out["job"], key=kind.name,  # type: ignore[name-defined]
                                    **extra)

    def create(self, kind: ResourceKind[Any], body: dict[str, Any]) -> Accepted[Any]:
        """``POST /{plural}`` (202: the resource and its job)."""
        _, out, _ = self.request("POST", f"/{kind.plural}", json=body)
        return self._accepted(kind, out)

    def list(self, kind: ResourceKind[Any], *, status: str | None = None, limit: int | None = None,
             after: str | None = None, name: str | None = None, label_selector: str | None = None,
             include_deleted: bool | None = None, **filters: Any) -> Page[Any]:
        """One page of ``GET /{plural}``; ``include_deleted=False`` leaves out the deleted ones (a
        name lookup then finds the live one, not last week's)."""
        params = {"status": status, "limit": limit, "after": after, "name": name, "label_selector": label_selector,
                  "include_deleted": None if include_deleted is None else str(include_deleted).lower(), **filters}
        _, out, _ = self.request("GET", f"/{kind.plural}", params=params)
        return Page[kind.model](items=out[kind.key], next_after=out.get("next_after"))  # type: ignore[name-defined]

    def iter(self, kind: ResourceKind[Any], **filters: Any) -> Iterator[Any]:
        """Every item of ``GET /{plural}`` (every page)."""
        after = None
        while True:
            page = self.list(kind, after=after, limit=500, **filters)
            yield from page.items
            if page.next_after is None:
                return
            after = page.next_after

    def get(self, kind: ResourceKind[Any], rid: str) -> Any:
        _, out, _ = self.request("GET", f"/{kind.plural}/{rid}")
        return kind.model.model_validate(out[kind.name])

    def delete(self, kind: ResourceKind[Any], rid: str, params: dict[str, Any] | None = None) -> Accepted[Any]:
        """``DELETE /{plural}/{id}`` (``params``: the query options the route declares)."""
        _, out, _ = self.request("DELETE", f"/{kind.plural}/{rid}", params=params)
        return self._accepted(kind, out)

    def restore(self, kind: ResourceKind[Any], rid: str) -> Accepted[Any]:
        """Cancel a deletion within its buffer (``POST /{plural}/{id}/actions/cancel-deletion``)."""
        return self.action(kind, rid, "cancel-deletion")

    def action(self, kind: ResourceKind[Any], rid: str, action: str, body: dict[str, Any] | None = None) -> Accepted[Any]:
        """``POST /{plural}/{id}/actions/{action}`` (202: the resource and its job)."""
        _, out, _ = self.request("POST", f"/{kind.plural}/{rid}/actions/{action}", json=body)
        return self._accepted(kind, out)

    def plan(self, kind: ResourceKind[Any], rid: str) -> Plan:
        """``POST /{plural}/{id}/actions/plan`` (200, at once: changes nothing, so no Idempotency-Key)."""
        _, out, _ = self.request("POST", f"/{kind.plural}/{rid}/actions/plan", retry=False)
        return Plan.model_validate(out)

    def update(self, kind: ResourceKind[Any], rid: str, body: dict[str, Any]) -> Any:
        """``PATCH /{plural}/{id}`` (no job): the resource as it now is."""
        _, out, _ = self.request("PATCH", f"/{kind.plural}/{rid}", json=body)
        return kind.model.model_validate(out[kind.name])

    # ------------------------------------------------------------------ servers

    def create_server(self, spec: ServerCreate | dict[str, Any]) -> Accepted[Server]:
        body = spec if isinstance(spec, ServerCreate) else ServerCreate.model_validate(spec)
        return self.create(SERVERS, body.model_dump(mode="json"))

    def list_servers(self, *, status: str | None = None, limit: int | None = None,
                     after: str | None = None, name: str | None = None,
                     label_selector: str | None = None, include_deleted: bool | None = None) -> Page[Server]:
        return self.list(SERVERS, status=status, limit=limit, after=after, name=name, label_selector=label_selector,
                         include_deleted=include_deleted)

    def iter_servers(self, *, status: str | None = None, name: str | None = None,
                     label_selector: str | None = None, include_deleted: bool | None = None) -> Iterator[Server]:
        return self.iter(SERVERS, status=status, name=name, label_selector=label_selector,
                         include_deleted=include_deleted)

    def get_server(self, server_id: str) -> Server:
        return self.get(SERVERS, server_id)

    def delete_server(self, server_id: str) -> Accepted[Server]:
        return self.delete(SERVERS, server_id)

    def restore_server(self, server_id: str) -> Accepted[Server]:
        """Cancel a deletion within its buffer (``POST /servers/{id}/actions/cancel-deletion``)."""
        return self.restore(SERVERS, server_id)

    def server_action(self, server_id: str, action: str, body: dict[str, Any] | None = None) -> Accepted[Server]:
        """``POST /servers/{id}/actions/{action}`` (start, shutdown, poweroff, reboot, resize)."""
        return self.action(SERVERS, server_id, action, body)

    def resize_server(self, server_id: str, *, cores: int | None = None, memory_mib: int | None = None,
                      disk_gib: int | None = None) -> Accepted[Server]:
        body = {k: v for k, v in (("cores", cores), ("memory_mib", memory_mib), ("disk_gib", disk_gib)) if v is not None}
        return self.server_action(server_id, "resize", body)

    def update_server(self, server_id: str, *, name: str | None = None,
                      labels: dict[str, str] | None = None) -> Server:
        """``PATCH /servers/{id}``: rename and/or replace the labels (no job)."""
        return self.update(SERVERS, server_id, _given(name=name, labels=labels))

    # ------------------------------------------------------------------ addresses

    def create_address(self, body: dict[str, Any]) -> Accepted[Address]:
        return self.create(ADDRESSES, body)

    def list_addresses(self, *, status: str | None = None, limit: int | None = None, after: str | None = None,
                       server_id: str | None = None, label_selector: str | None = None,
                       name: str | None = None, include_deleted: bool | None = None) -> Page[Address]:
        return self.list(ADDRESSES, status=status, limit=limit, after=after, server_id=server_id,
                         label_selector=label_selector, name=name, include_deleted=include_deleted)

    def get_address(self, address_id: str) -> Address:
        return self.get(ADDRESSES, address_id)

    def delete_address(self, address_id: str) -> Accepted[Address]:
        return self.delete(ADDRESSES, address_id)

    def address_action(self, address_id: str, action: str, body: dict[str, Any] | None = None) -> Accepted[Address]:
        """``POST /addresses/{id}/actions/{action}`` (assign, unassign, cancel-deletion)."""
        return self.action(ADDRESSES, address_id, action, body)

    def update_address(self, address_id: str, *, name: str | None = None, labels: dict[str, str] | None = None,
                       dns_ptr: str | None = None) -> Address:
        """``PATCH /addresses/{id}``: name, labels (replacing them all), reverse DNS (no job)."""
        return self.update(ADDRESSES, address_id, _given(name=name, labels=labels, dns_ptr=dns_ptr))

    # ------------------------------------------------------------------ load balancers

    def create_load_balancer(self, body: dict[str, Any]) -> Accepted[LoadBalancer]:
        """``POST /load-balancers`` (``name``, ``region``, ``type``, ``algorithm``, ``services``,
        ``targets``, ``labels``; the API's LoadBalancerCreate)."""
        return self.create(LOAD_BALANCERS, body)

    def list_load_balancers(self, **filters: Any) -> Page[LoadBalancer]:
        return self.list(LOAD_BALANCERS, **filters)

    def get_load_balancer(self, lb_id: str) -> LoadBalancer:
        return self.get(LOAD_BALANCERS, lb_id)

    def update_load_balancer(self, lb_id: str, *, name: str | None = None,
                             labels: dict[str, str] | None = None) -> LoadBalancer:
        return self.update(LOAD_BALANCERS, lb_id, _given(name=name, labels=labels))

    def delete_load_balancer(self, lb_id: str) -> Accepted[LoadBalancer]:
        return self.delete(LOAD_BALANCERS, lb_id)

    def restore_load_balancer(self, lb_id: str) -> Accepted[LoadBalancer]:
        return self.restore(LOAD_BALANCERS, lb_id)

    def load_balancer_action(self, lb_id: str, action: str, body: dict[str, Any]) -> Accepted[LoadBalancer]:
        """``POST /load-balancers/{id}/actions/{action}``: add-target, remove-target, add-service,
        update-service, delete-service, change-algorithm (each a LoadBalancerConfigure job)."""
        return self.action(LOAD_BALANCERS, lb_id, action, body)

    def add_load_balancer_target(self, lb_id: str, *, server_id: str | None = None,
                                 ip: str | None = None) -> Accepted[LoadBalancer]:
        return self.load_balancer_action(lb_id, "add-target", lb_target(server_id=server_id, ip=ip))

    def remove_load_balancer_target(self, lb_id: str, *, server_id: str | None = None,
                                    ip: str | None = None) -> Accepted[LoadBalancer]:
        return self.load_balancer_action(lb_id, "remove-target", lb_target(server_id=server_id, ip=ip))

    def add_load_balancer_service(self, lb_id: str, service: dict[str, Any]) -> Accepted[LoadBalancer]:
        return self.load_balancer_action(lb_id, "add-service", service)

    def update_load_balancer_service(self, lb_id: str, listen_port: int, **changes: Any) -> Accepted[LoadBalancer]:
        return self.load_balancer_action(lb_id, "update-service", {"listen_port": listen_port, **changes})

    def delete_load_balancer_service(self, lb_id: str, listen_port: int) -> Accepted[LoadBalancer]:
        return self.load_balancer_action(lb_id, "delete-service", {"listen_port": listen_port})

    def change_load_balancer_algorithm(self, lb_id: str, algorithm: str) -> Accepted[LoadBalancer]:
        return self.load_balancer_action(lb_id, "change-algorithm", {"type": algorithm})

    # ------------------------------------------------------------------ clusters

    def create_cluster(self, body: dict[str, Any]) -> Accepted[Cluster]:
        """``POST /clusters`` (``name``, ``region``, ``version``, ``control_plane``, ``node_pools``, …)."""
        return self.create(CLUSTERS, body)

    def list_clusters(self, **filters: Any) -> Page[Cluster]:
        return self.list(CLUSTERS, **filters)

    def get_cluster(self, cluster_id: str) -> Cluster:
        return self.get(CLUSTERS, cluster_id)

    def update_cluster(self, cluster_id: str, *, labels: dict[str, str]) -> Cluster:
        return self.update(CLUSTERS, cluster_id, {"labels": labels})

    def delete_cluster(self, cluster_id: str) -> Accepted[Cluster]:
        """At once (no buffer): ``destroying`` and a ClusterDelete job."""
        return self.delete(CLUSTERS, cluster_id)

    def add_node_pool(self, cluster_id: str, pool: dict[str, Any]) -> Accepted[Cluster]:
        return self.action(CLUSTERS, cluster_id, "add-node-pool", pool)

    def resize_node_pool(self, cluster_id: str, pool: str, count: int) -> Accepted[Cluster]:
        return self.action(CLUSTERS, cluster_id, "resize-node-pool", {"pool": pool, "count": count})

    def remove_node_pool(self, cluster_id: str, pool: str) -> Accepted[Cluster]:
        return self.action(CLUSTERS, cluster_id, "remove-node-pool", {"pool": pool})

    def get_kubeconfig(self, cluster_id: str, *, expiry_s: int | None = None) -> Kubeconfig:
        """A kubeconfig with a client certificate minted now, valid ``expiry_s`` seconds (the API's
        default: 3600); 409 ``cluster_not_ready`` before the cluster was first ready."""
        _, out, _ = self.request("GET", f"/clusters/{cluster_id}/kubeconfig", params={"expiry_s": expiry_s})
        return Kubeconfig.model_validate(out)

    # ------------------------------------------------------------------ quota

    def get_quota(self) -> Quota:
        """``GET /quota``: the calling tenant's limits and use."""
        _, out, _ = self.request("GET", "/quota")
        return Quota.model_validate(out)

    # ------------------------------------------------------------------ catalogue

    def list_regions(self) -> list[dict[str, Any]]:
        _, out, _ = self.request("GET", "/regions")
        return list(out["regions"])

    def list_images(self, *, region: str | None = None) -> list[dict[str, Any]]:
        _, out, _ = self.request("GET", "/images", params={"region": region})
        return list(out["images"])

    # ------------------------------------------------------------------ jobs

    def cancel_job(self, job_id: str) -> Job:
        """Cancel a pending or retrying job (409 ``job_running`` for a running one)."""
        _, out, _ = self.request("POST", f"/jobs/{job_id}/actions/cancel")
        return Job.model_validate(out["job"])

    def rerun_job(self, job_id: str) -> Job:
        """A failed job's intent as a new job (returned)."""
        return self.rerun_job_all(job_id)[0]

    def rerun_job_all(self, job_id: str) -> list[Job]:
        """Every job a re-run made, the re-run job first (a server's failed create re-runs its
        primary address's failed AddressAssign too: the API's ``jobs``)."""
        _, out, _ = self.request("POST", f"/jobs/{job_id}/actions/rerun")
        return [Job.model_validate(j) for j in out.get("jobs") or [out["job"]]]

    def get_job(self, job_id: str, *, wait_s: int = 0) -> Job:
        """The job; with ``wait_s`` (≤ 60), once its status or steps changed or after that long."""
        _, out, _ = self.request("GET", f"/jobs/{job_id}", params={"wait_s": wait_s or None},
                                 timeout_s=self.request_timeout_s + wait_s)
        return Job.model_validate(out)

    def list_jobs(self, *, resource_id: str | None = None, actor: str | None = None, limit: int | None = None,
                  after: str | None = None, order: str | None = None, status: str | None = None,
                  kind: str | None = None, include_observe: bool | None = None) -> Page[Job]:
        """One page of ``GET /jobs``: ``order`` ``oldest`` (the API's default) or ``newest``;
        ``status``/``kind`` filters; ``include_observe=False`` leaves out the periodic observe-only
        jobs (LoadBalancerObserve, ClusterObserve)."""
        _, out, _ = self.request("GET", "/jobs", params={
            "resource_id": resource_id, "actor": actor, "limit": limit, "after": after, "order": order,
            "status": status, "kind": kind,
            "include_observe": None if include_observe is None else str(include_observe).lower()})
        return Page[Job](items=out["jobs"], next_after=out.get("next_after"))

    def wait_job(self, job_id: str, *, timeout_s: float = 1800.0, on_change: Callable[[Job], None] | None = None,
                 poll_s: int = 30) -> Job:
        """Follow the job until it is terminal (returned, succeeded or failed) through the
        long-poll; raise :class:`Deadline` after ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        job = self.get_job(job_id)
        if on_change:
            on_change(job)
        while not job.terminal:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Deadline(job, timeout_s)
            seen = job
            job = self.get_job(job_id, wait_s=max(1, min(poll_s, 60, int(left))))
            if on_change and (job.status, job.attempt, job.steps) != (seen.status, seen.attempt, seen.steps):
                on_change(job)
        return job

    # ------------------------------------------------------------------ tokens

    def create_token(self, spec: TokenCreate | dict[str, Any]) -> TokenCreated:
        body = spec if isinstance(spec, TokenCreate) else TokenCreate.model_validate(spec)
        _, out, _ = self.request("POST", "/tokens", json=body.model_dump(mode="json", exclude_none=True), retry=False)
        return TokenCreated.model_validate(out)

    def list_tokens(self, *, include_revoked: bool = False, limit: int | None = None,
                    after: str | None = None) -> Page[Token]:
        _, out, _ = self.request("GET", "/tokens", params={"include_revoked": "true" if include_revoked else None,
                                                           "limit": limit, "after": after})
        return Page[Token](items=out["tokens"], next_after=out.get("next_after"))

    def revoke_token(self, token_id: str) -> Token:
        _, out, _ = self.request("DELETE", f"/tokens/{token_id}")
        return Token.model_validate(out["token"])


def _given(**fields: Any) -> dict[str, Any]:
    """The fields that are not None (a PATCH body: what is left out is unchanged)."""
    return {k: v for k, v in fields.items() if v is not None}


def lb_target(*, server_id: str | None = None, ip: str | None = None) -> dict[str, Any]:
    """A load balancer target: a server of the region (``srv_…``) or an IP."""
    if (server_id is None) == (ip is None):
        raise ValueError("a target is a server_id or an ip")
    return {"type": "server", "server_id": server_id} if server_id else {"type": "ip", "ip": ip}
