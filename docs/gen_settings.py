"""Generate ``docs/settings.md``, the table of every ``Z9_`` setting, from the settings model
(``libs/common/z9/common/settings.py``): names, types, defaults and bounds come from the model, the
meaning from the field's ``description`` or, when it has none, from :data:`DESCRIPTIONS` here (the
``Z9_QUOTA_<UNIT>`` rows: from the resource types' quota units, ``z9.resources.quota_units``).

    .venv/bin/python docs/gen_settings.py           # rewrite docs/settings.md
    .venv/bin/python docs/gen_settings.py --check   # exit 1 when it is out of date

A new setting without a description fails the generator (and ``tests/unit/test_settings_doc.py``):
add one here (or as ``Field(description=…)``) and re-run it — after a merge that brought
settings, re-running is all it takes.
"""
from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from z9.common.settings import RegionSettings, Settings

OUT = Path(__file__).resolve().parent / "settings.md"

DESCRIPTIONS: dict[str, str] = {
    # Kubernetes clusters (issue 11)
    "installation_key": "32 bytes, base64: seals every Kubernetes cluster's private keys (AES-256-GCM, the cluster id as "
                        "associated data). `z9 dev` generates one into its data dir. Unset: creating a cluster or "
                        "minting a kubeconfig answers 503 `installation_key_missing`; the executor cannot bootstrap members. The API also tags the tokens it mints with a key derived "
                        "from it (an HMAC: `z9t_<random>.<tag>`): from a client address limited for failed "
                        "authentications (`Z9_API_AUTH_FAILURES_PER_S`) a token whose tag verifies is still looked "
                        "up, so others' bad tokens never lock a valid one out of a shared address (a token "
                        "without a tag — older, or minted without the key — is limited with the address).",
    "cluster_join_token_ttl_s": "Life of a bootstrap token z9 mints for one member's join (kubeadm `--ttl`); a member not "
                                "started yet whose token is older than half of it gets a new one.",
    "cluster_bootstrap_storage": "Storage the members' NoCloud bootstrap ISOs are uploaded to (shared: every node sees it; "
                                 "node-local: the ISO goes to the member's own node). Each ISO is deleted once its member is Ready.",
    "cluster_member_ready_s": "How long a member may take from its start to a Ready Kubernetes node before the job says "
                              "which member is late (a temporary error: the next attempt waits on).",
    "cluster_observe_interval_s": "A running or degraded Kubernetes cluster is observed at least this often: the reaper "
                                  "enqueues a ClusterObserve (each member's power state and Node readiness, read inside "
                                  "a control plane; the status moves between running and degraded) when none is live.",
    # database
    "database_url": "PostgreSQL connection string of every service's pooled queries (may go through PgBouncer). "
                    "Several hosts for high availability: `postgresql://z9@db1:5432,db2:5432/z9?target_session_attrs=read-write`; "
                    "z9 also refuses any connection that lands on a standby. Required (except for `z9 dev`, which starts an embedded PostgreSQL).",
    "database_direct_url": "Connection string of every LISTEN connection and of `z9 migrate`: direct to PostgreSQL "
                           "(or a session pooler), never a transaction pooler (it drops notifications silently). Unset: `Z9_DATABASE_URL`; required with `Z9_DATABASE_POOLER=transaction`.",
    "database_pooler": "What sits in front of `Z9_DATABASE_URL`: `none`; `session` or `transaction` = PgBouncer in that pool mode "
                       "(z9 then sends no `plan_cache_mode` startup parameter — set it with `ALTER ROLE/DATABASE … SET plan_cache_mode = "
                       "force_custom_plan`, checked on every connection — and `transaction` turns asyncpg's prepared-statement cache off). "
                       "The bounded waits (`Z9_*_DB_LOCK_TIMEOUT_S`, `Z9_DB_STATEMENT_TIMEOUT_S`, `Z9_DB_IDLE_IN_TRANSACTION_TIMEOUT_S`, "
                       "the server side's keepalives) cannot be startup parameters behind PgBouncer either: set them with `ALTER ROLE … SET`.",
    "database_require_sync_replication": "Refuse to run (pool and LISTEN connections) on a server whose commits do not wait for a "
                                         "synchronous standby (`synchronous_standby_names` empty or `synchronous_commit` off/local): "
                                         "the 202 promise survives a failover only with synchronous replication.",
    "database_sync_commit_timeout_s": "A commit of a service's pooled connection (an explicit `COMMIT`, or a statement outside a "
                                      "transaction) without an answer after this many seconds is abandoned: the connection is "
                                      "closed, the outcome taken as unknown, and the next connection chosen again (the writable "
                                      "host on the newest timeline). A commit waiting on synchronous replication for a standby "
                                      "that is gone would otherwise wait until `statement_timeout` ends it with a success that "
                                      "is not durable. Shorter than `Z9_DB_STATEMENT_TIMEOUT_S`; 0: no bound.",
    "api_db_lock_timeout_s": "`lock_timeout` of the API's pooled connections (seconds, 0 = none): a request waiting on a row another "
                             "transaction holds gives up after this long (503, retry) instead of piling up behind it.",
    "executor_db_lock_timeout_s": "`lock_timeout` of the executor's pooled connections (seconds, 0 = none). A batched finish that hits it "
                                  "rolls back; its jobs finish one by one, and the one still blocked is retried on its own (its lease "
                                  "kept renewed) while every other job and claim goes on.",
    "scheduler_db_lock_timeout_s": "`lock_timeout` of the scheduler's and the reaper's pooled connections (seconds, 0 = none).",
    "db_statement_timeout_s": "`statement_timeout` of every service's pooled connections (seconds, 0 = none).",
    "db_idle_in_transaction_timeout_s": "`idle_in_transaction_session_timeout` of every service's connections (seconds, 0 = none): "
                                        "PostgreSQL ends the session of a process frozen inside a transaction (SIGSTOP, a stuck "
                                        "event loop), so the row locks it holds are released. z9 never waits on anything else "
                                        "inside a transaction.",
    "db_tcp_keepalives_idle_s": "TCP keepalive of every z9 connection, both ends (PostgreSQL's `tcp_keepalives_idle` and the client "
                                "socket's): seconds of silence before the first probe (0 = the system's default, about 2 hours).",
    "db_tcp_keepalives_interval_s": "Seconds between TCP keepalive probes (both ends; 0 = the system's default).",
    "db_tcp_keepalives_count": "Unanswered TCP keepalive probes before the connection is dropped (both ends; 0 = the system's "
                               "default): a partitioned peer's session and its locks end after idle + interval × count seconds.",
    "data_dir": "State folder of `z9 dev` (embedded PostgreSQL data, dev token, simulator state and secret).",
    "regions": "JSON object: region name → Proxmox VE cluster (fields below).",
    # api
    "api_host": "Bind address of `z9 api`.",
    "api_port": "Port of `z9 api` (it also serves `GET /metrics` there).",
    "console_session_idle_s": "A web console session ends after this long without use (seconds; its expiry moves on with use, written at most once a minute).",
    "console_session_max_s": "A web console session ends this long after sign-in whatever its use (seconds); a session also ends with its token (revoked, expired) and at sign-out.",
    "api_token_cache_s": "How long an API process remembers a valid token's tenant (a revoked token keeps working up to this long); 0: no cache.",
    "tracing_ui_url": "The tracing UI a job's trace id links to in the console's operator view and in `GET /v1/operator/jobs/{id}` (`trace_url`): a URL holding `{trace_id}`, e.g. Jaeger's `http://127.0.0.1:16686/trace/{trace_id}`. Unset: no link.",
    "api_token_last_used_s": "How often an API process writes the last use of the tokens it saw (one write for all of them, not one per request); `GET /v1/tokens` shows last use this coarsely.",
    "api_rate_limit_per_s": "Rate limit per tenant and API process (every token of a tenant spends from one bucket: a new token brings no new requests): requests per second refilling the bucket; 0 turns rate limiting off. Over it: 429 with `Retry-After` and `RateLimit` headers.",
    "api_rate_limit_burst": "Rate limit per tenant and API process: the bucket's size (requests allowed at once).",
    "api_max_concurrent_plans": "Plans (`POST /v1/<kind>/{id}/actions/plan`) running at once per API process, each waiting on its "
                                "region's Proxmox VE (no database connection held meanwhile); one tenant holds at most half of "
                                "them (rounded up). Past it: 429 `too_many_plans` with `Retry-After` at once.",
    "api_auth_failures_per_s": "Failed authentications (unknown, expired or revoked bearer token) per client address and API process: "
                               "failures per second refilling the address's bucket (an IPv6 address: its /64); 0 turns the limit off. "
                               "Once the bucket is empty, a request from that address answers 429 `rate_limited` with "
                               "`Retry-After` before its token is looked up (no database lookup per bad token) — unless the "
                               "token is one this process knows, or carries a tag that verifies (a token z9 minted with "
                               "the installation key: still looked up, once if it turns out revoked or expired).",
    "api_auth_failure_burst": "Failed authentications per client address and API process: the bucket's size.",
    "kubeconfig_max_expiry_s": "Longest `expiry_s` of a kubeconfig's client certificate (`GET /v1/clusters/{id}/kubeconfig`); "
                               "past it: 422 naming `expiry_s`. A certificate never outlives the minting token either. Also the "
                               "`--cluster-signing-duration` of a cluster's kube-controller-manager (set when the cluster "
                               "is created): the longest certificate its CSR API signs, users' and kubelets' alike.",
    "api_pool_size": "Most pooled connections one API process opens (and one LISTEN connection beside them); a request "
                     "waits for a free one. Keep the sum over every service under PostgreSQL's `max_connections` "
                     "(or PgBouncer's pool): see `Z9_EXECUTOR_CONCURRENCY`.",
    # executor
    "executor_concurrency": "Jobs one executor runs at once (`z9 executor --concurrency`). Each executor process opens "
                            "up to this + 4 pooled connections and one LISTEN connection; an API process up to `Z9_API_POOL_SIZE` (16) + 1, "
                            "the scheduler 2 + 1, the reaper 2: keep their sum under PostgreSQL's `max_connections` "
                            "(or PgBouncer's pool). Past what the region's Proxmox cluster takes at once, cap the region "
                            "(`max_concurrent_jobs`, below) rather than lowering this.",
    "trace_uneventful_ratio": "With OTLP export on: the share of uneventful job attempts (succeeded with an empty "
                              "plan: a job run a second time, a periodic observe that found nothing to change) "
                              "whose spans are exported. Every other attempt is exported whole; an attempt's "
                              "spans are kept as plain records until it has something to do, so an uneventful "
                              "one costs no SDK span and no export (README, Traces). 1: every attempt.",
    "lease_ttl_s": "Lease of a running job; an executor that stops renewing it loses the job to the scheduler's reclaim. "
                   "A dead, frozen or partitioned executor's jobs go back to `retry` (due at once) within this long of "
                   "their last renewal plus `Z9_SCHEDULER_INTERVAL_S`, and the lost attempt counts against "
                   "`Z9_MAX_ATTEMPTS`. Shorter: faster takeover; but a stall longer than it (a database failover, a "
                   "long pause) hands the job to another executor, and the stalled one stops at its next heartbeat "
                   "or fenced write.",
    "heartbeat_s": "How often an executor renews the leases of its running jobs (shorter than `Z9_LEASE_TTL_S`, or the "
                   "service refuses to start): `Z9_LEASE_TTL_S` − this is how late one renewal may be before the lease "
                   "expires.",
    "lease_safety_margin": "The part of `Z9_LEASE_TTL_S` before a lease's expiry after which a job sends no more "
                           "Proxmox calls: each attempt keeps a local deadline (monotonic clock, from the last "
                           "renewal it sent) and refuses a call past it, so an executor stopped past its lease "
                           "(SIGSTOP, a frozen VM) sends nothing when it wakes. `Z9_HEARTBEAT_S` plus this margin "
                           "must be shorter than the TTL.",
    "poll_interval_s": "Fallback claim poll of executors (besides NOTIFY), and the LISTEN connection's liveness check.",
    "step_timeout_s": "No progress (no answer about the job's task) for this long: the executor stops renewing the job's lease.",
    "task_poll_s": "How often a Proxmox task (UPID) is polled while a job waits for it.",
    "task_deadline_s": "Longest wait for one Proxmox task before the attempt fails as temporary.",
    "shutdown_grace_s": "On SIGTERM, how long an executor lets running jobs finish before handing them back. Every "
                        "service (api, scheduler, executor, reaper) ends at the latest this + 10 s after SIGTERM or "
                        "SIGINT, or at a second signal, whatever it waits on (a database gone silent).",
    "snooze_s": "Wait before retrying a job whose VM is locked by another task (no attempt spent).",
    "snooze_limit_s": "Longest a job waits on a locked VM (since its first snooze); after that the wait is a temporary error that spends an attempt.",
    "uncertain_window_s": "A mutation whose answer was lost may still be performed this long afterwards: observe waits for it.",
    # backoff
    "backoff_base_s": "Retry backoff base: `min(cap, base·2^(attempt-1))` × a random factor.",
    "backoff_cap_s": "Retry backoff cap (at least `Z9_BACKOFF_BASE_S`).",
    "backoff_jitter": "Random factor range of the backoff: [1 − j, 1 + j].",
    "max_attempts": "Attempts of a job before it fails for good.",
    "max_live_jobs_per_resource": "A DELETE or cancel-deletion answers 409 while the server already has this many jobs waiting or running.",
    # scheduler, reaper, retention
    "scheduler_interval_s": "Longest sleep of the scheduler between passes (retry promotion, lease reclaim).",
    "reaper_interval_s": "How often the reaper looks for expired deletion buffers.",
    "deletion_buffer_s": "Time between `DELETE` (VM stopped) and the final delete job; cancel-deletion works within it.",
    "job_retention_s": "Finished jobs are pruned after this long.",
    "idempotency_retention_s": "How long an `Idempotency-Key` answer is kept.",
    "lb_health_interval_s": "Load balancer health is at most this old: the reaper enqueues an observe-only "
                            "`LoadBalancerObserve` for every live load balancer not observed for this long "
                            "(and without a live job). See `resources/z9/resources/load_balancer/README.md`.",
    "lb_max_target_services": "Most targets × services of one load balancer (each one HAProxy server line and one health "
                              "check); past it: 409 `resource_limit_exceeded` naming the setting.",
    "lb_max_checks_per_s": "Most health checks per second one appliance makes (the sum over targets × services of "
                           "1 / `interval_s`); past it: 409 `resource_limit_exceeded` naming the setting.",
    # observability
    "log_level": "`DEBUG`, `INFO`, `WARNING`, `ERROR`.",
    "log_format": "`json` (one object per line on stderr) or `text` (what `z9 dev` uses unless set).",
    "metrics_host": "Bind address of every service's `/metrics` listener (`0.0.0.0` in containers).",
    "metrics_port": "Its `/metrics` port, a listener of its own — the API's never on the tenants' port; 0 serves none "
                    "(`z9 dev` sets 9101–9104: scheduler, executor, reaper, api; moved by `--metrics-port`).",
    "installation_key_file": "A file holding the installation key (a mounted secret), read when `Z9_INSTALLATION_KEY` "
                             "is unset; a process without the file has no key.",
    "api_max_connections": "Connections one API process keeps open in all; lowered at start to its descriptor limit "
                           "(the soft `RLIMIT_NOFILE`, raised to the hard limit) less a reserve, so `accept()` never "
                           "fails for lack of descriptors. One over the cap is answered 503 `too_many_connections` "
                           "and closed before it is read (`z9_api_connections_refused_total{reason=\"total\"}`).",
    "api_max_connections_per_address": "Connections one client address may hold open at once; over it: 503 and closed "
                                       "(`reason=\"per_address\"`), logged at a bounded rate. Clients behind one "
                                       "NAT or proxy share it: raise it when the API is reached through one.",
    "api_header_timeout_s": "A request's headers must be complete this long after its first byte, or the connection "
                            "is closed (`reason=\"header_timeout\"`).",
    "api_body_timeout_s": "A request's body must be complete this long after its headers, or the connection is closed "
                          "(`reason=\"body_timeout\"`; the request is counted as 499, never as a 5xx).",
    "api_idle_timeout_s": "A connection that sends nothing this long — a new one, or one idle between requests — is "
                          "closed (aiohttp's keep-alive timeout).",
    "job_metrics_interval_s": "How often the scheduler recounts live jobs for `z9_jobs` and the oldest pending age.",
    "job_metrics_finished_interval_s": "How often it recounts finished jobs (most of the table).",
}

REGION_DESCRIPTIONS: dict[str, str] = {
    "url": "Proxmox VE API endpoint, `https://host:8006` (HTTPS only).",
    "token_id": "API token id, `USER@REALM!TOKENID`.",
    "token_secret": "API token secret. The executor needs it; the api (plans: `POST …/actions/plan`) and "
                    "the reaper (periodic drift checks) use it when given, and only read with it (their client "
                    "refuses any request but a GET); without it a plan answers 503 and the reaper checks no drift "
                    "in the region (or use `token_secret_file`).",
    "token_secret_file": "A file holding the token secret (a secret mounted into the executor only), read when "
                         "`token_secret` is unset; a process without the file (the api, scheduler, reaper) has none.",
    "verify_ssl": "`true`/`false`, or the path of a CA bundle.",
    "images": "Template names the API accepts for the region (empty: any; the executor finds out).",
    "request_timeout_s": "Timeout of one HTTP request to Proxmox (seconds).",
    "resources_snapshot_s": "How old the executor process's shared `/cluster/resources` snapshot may be (seconds): "
                            "every job of the process reads it (one request in flight, shared) instead of listing the "
                            "cluster itself, and confirms each VM by its own config; a job that needs a newer listing "
                            "(after its claim, after a disagreement) waits for one. 0: a new listing for every lookup "
                            "not already sharing one in flight.",
    "resources_snapshot_create_s": "How old that snapshot may be for a create's lookup of its VM and the template "
                                   "lookup (seconds), which have an authority of their own for \"none\": the create's "
                                   "clone ledger names every VM z9 cloned for it (each read on its node), and no "
                                   "template found in an older snapshot makes a listing newer than the job's claim. "
                                   "Longer than `resources_snapshot_s` so a busy region of 10,000 VMs is not listed "
                                   "for every few creates (bench/README.md, issue 13). Never shorter than "
                                   "`resources_snapshot_s` in effect.",
    "max_concurrent_jobs": "Most jobs of the region running at once, across every executor process serving it (the "
                           "hypervisor is the limit, not z9). Enforced in the claim: a per-region transaction-scoped "
                           "advisory lock serializes the region's claims, which count its running jobs with an "
                           "unexpired lease and take at most the difference (a dead executor's slots free up when its "
                           "leases expire). Unset: no cap and no extra work in the claim. Give every executor of the "
                           "region the same value. Held-back claims: `z9_region_cap_waits_total` and an INFO log line.",
    "address_pools": "The region's address pools: a list of `{name, cidr, gateway?, range?: [first, last], "
                     "reserved?: [ip…], bridge? (vmbr0), vlan?, nameservers?, quarantine_s? (3600)}`; `range` "
                     "defaults to every host address, at most 65,536 per pool; pools of a region must not "
                     "overlap. Written to the database by `z9 migrate` and every API start; a pool taken "
                     "out is disabled, not deleted. See `resources/z9/resources/address/README.md`.",
    "platform_networks": "Networks of the platform in the region (the region agent's network, the Proxmox nodes', "
                         "storage, management; list of CIDRs): never a load balancer's `ip` target (422, rule "
                         "`platform_network`), whatever `lb_target_private_networks` says. Every address pool's network "
                         "is refused too (rule `address_pool`), but for the tenant's own addresses in it.",
    "lb_target_private_networks": "Non-public networks (CIDRs) a load balancer's `ip` target may be in (e.g. a tenant network "
                                  "the appliances reach). By default an `ip` target is a public unicast address: RFC 1918, "
                                  "100.64/10, 198.18/15 and other non-global ranges answer 422 (rule `private_range`).",
    "private_network": "The network every guest without a pool address of its own (a server without a primary "
                       "address, a Kubernetes cluster's members) gets its IPv4 address from: `{cidr, gateway?, "
                       "range?: [first, last], reserved?: [ip…], nameservers?, quarantine_s? (600)}`. z9 chooses "
                       "each VM's address (one per VM, kept until the VM is removed, then quarantined), writes it as "
                       "the guest's static cloud-init network and puts the Proxmox IP filter on with exactly it "
                       "before the VM first starts, so a guest cannot take an address it was not given. Unset: "
                       "such guests take DHCP from the bridge and stay unfiltered (z9 cannot know their lease). "
                       "Never a load balancer's `ip` target (rule `address_pool`). See `resources/z9/resources/address/README.md`.",
    "lb_image": "Name of the operator-provided template load balancer appliances are cloned from (HAProxy, "
                "keepalived, the QEMU guest agent enabled, a cloud-init drive). See `resources/z9/resources/load_balancer/README.md`.",
}

#: Variables outside the settings model (read by one tool or by the tests), listed by hand.
OTHER = [
    ("Z9_SIM_TOKEN_SECRET", "`z9 sim`: its API token secret when `--token-secret-file` is not given (never on a command line)."),
    ("Z9_TEST_DATABASE_URL", "Tests: the PostgreSQL server they create their `z9_test_*` databases on (else an embedded one)."),
    ("Z9_TEST_TESTCONTAINERS", "Tests: `1` = PostgreSQL from testcontainers when no URL is given."),
    ("Z9_REQUIRE_PROMETHEUS", "Tests: `1` = fail instead of skipping without `prometheus`/`promtool`."),
    ("Z9_REQUIRE_PGBOUNCER", "Tests: `1` = fail instead of skipping without `pgbouncer`."),
    ("Z9_REQUIRE_HA", "Tests: `1` = fail instead of skipping without Debian's PostgreSQL binaries (failover tests)."),
    ("Z9_REQUIRE_OPENAPI_LINT", "Tests: `1` = fail instead of skipping without Redocly CLI "
                                "(`cd tools/openapi-lint && npm ci`)."),
    ("Z9_BENCH_DSN", "Benchmarks: admin connection string (`bench/run.py --dsn`)."),
]


def _type(ann: Any) -> str:
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if type(None) in args and len(args) == 2:  # Optional[X]: "unset" is in the default column
        return _type(next(a for a in args if a is not type(None)))
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(ann))
    if ann is bool:
        return "bool"
    if ann is int:
        return "int"
    if ann is float:
        return "number"
    text = getattr(ann, "__name__", None) if origin is None else None
    if text == "Path":
        return "path"
    if text == "str":
        return "string"
    s = str(ann).replace("typing.", "")
    if "RegionSettings" in s:
        return "JSON object"
    if s in ("str | None",):
        return "string"
    if s == "bool | str":
        return "bool or path"
    if s == "list[str]":
        return "JSON list of strings"
    if "SecretStr" in s:
        return "string (secret)"
    if "AddressPoolSettings" in s:
        return "JSON list of pools"
    return s.replace("|", "\\|")  # a bare | would split the Markdown table's row


def _default(f: FieldInfo) -> str:
    if f.default is PydanticUndefined:
        if f.default_factory is not None:
            v = f.default_factory()
            return f"`{v!r}`" if v else "empty"
        return "required"
    if f.default is None:
        return "unset"
    v = f.default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool):
        v = str(v).lower()
    return f"`{v}`"


def _bounds(f: FieldInfo) -> str:
    out = []
    for m in f.metadata:
        for attr, sym in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
    return ", ".join(out)


SECRETS_BY_SERVICE = [
    ("Proxmox token secret (`Z9_REGIONS[r].token_secret` / `token_secret_file`)",
     ("for plans", "**yes**", "no", "for drift checks", "no")),
    ("installation key (`Z9_INSTALLATION_KEY` / `Z9_INSTALLATION_KEY_FILE`): clusters' keys, join tokens, job page "
     "tokens, API token tags", ("**yes**", "**yes**", "no", "no", "no")),
    ("database password (`Z9_DATABASE_URL`)", ("**yes**", "**yes**", "**yes**", "**yes**", "**yes**")),
]


def _describe(name: str, f: FieldInfo, table: dict[str, str], where: str) -> str:
    text = f.description or table.get(name)
    if not text:
        raise SystemExit(f"gen_settings: {where}.{name} has no description: add one to DESCRIPTIONS in "
                         f"docs/gen_settings.py (or Field(description=…)) and re-run")
    return text.replace("|", "\\|")


def env_rows(name: str, f: FieldInfo) -> list[tuple[str, str, str, str, str]] | None:
    """The rows of a setting read from one variable per key (``quota_defaults``: ``Z9_QUOTA_<UNIT>``,
    a row per quota unit the resource types declare), or None for a setting of one variable."""
    prefix = (f.json_schema_extra or {}).get("env_per_key") if isinstance(f.json_schema_extra, dict) else None
    if not prefix:
        return None
    from z9 import resources

    return [(f"{prefix}{k.upper()}", "int", "unset", "≥ 0",
             f"Default quota of every tenant, in {u.unit}: its {resources.quota_description(k)} (unset: no limit; "
             f"`z9 quota --tenant NAME --{k.replace('_', '-')} N` sets a tenant's own). Over it: 403 `quota_exceeded`.")
            for k, u in resources.quota_units().items()]


def render() -> str:
    lines = [
        "# z9 settings",
        "",
        "<!-- Generated by `.venv/bin/python docs/gen_settings.py` from `libs/common/z9/common/settings.py`; do not edit. -->",
        "",
        "Every service reads its settings from environment variables prefixed `Z9_` (one pydantic-settings",
        "model, `libs/common/z9/common/settings.py`); invalid values stop a service at start with the variable named.",
        "Units are in the names: `_s` seconds. Nested values are JSON.",
        "",
        "| variable | type | default | bounds | meaning |",
        "|---|---|---|---|---|",
    ]
    for name, f in Settings.model_fields.items():
        per_key = env_rows(name, f)
        if per_key is not None:
            lines += [f"| `{var}` | {t} | {d} | {b} | {text.replace('|', chr(92) + '|')} |" for var, t, d, b, text in per_key]
            continue
        lines.append(f"| `Z9_{name.upper()}` | {_type(f.annotation)} | {_default(f)} | {_bounds(f)} | "
                     f"{_describe(name, f, DESCRIPTIONS, 'Settings')} |")
    lines += ["", "## `Z9_REGIONS` entries", "",
              "`Z9_REGIONS` maps a region name to one Proxmox VE cluster:",
              "`{\"dev-1\": {\"url\": \"https://pve:8006\", \"token_id\": \"root@pam!z9\", \"token_secret\": \"…\", \"verify_ssl\": true, \"images\": [\"debian-12\"]}}`.",
              "", "| field | type | default | meaning |", "|---|---|---|---|"]
    for name, f in RegionSettings.model_fields.items():
        lines.append(f"| `{name}` | {_type(f.annotation)} | {_default(f)} | "
                     f"{_describe(name, f, REGION_DESCRIPTIONS, 'RegionSettings')} |")
    lines += ["", "## Which service needs which secret", "",
              "Give each service only the secrets it uses (`z9 dev`, `compose.yaml` and `deploy/k8s` do):", "",
              "| secret | api | executor | scheduler | reaper | migrate |", "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {' | '.join(row)} |" for name, row in SECRETS_BY_SERVICE]
    lines += ["", "The database password (in `Z9_DATABASE_URL`) every service needs. The API's tenants' token "
              "secrets are never stored (only their SHA-256); join tokens are stored sealed with the installation "
              "key, like the clusters' private keys.", ""]
    lines += ["", "## Other variables", "", "Not settings of the services; read by one tool or by the tests.", "",
              "| variable | meaning |", "|---|---|"]
    lines += [f"| `{k}` | {v} |" for k, v in OTHER]
    lines += ["", "Tracing is configured by the standard `OTEL_*` variables (see the README).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="generate docs/settings.md from the settings model")
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/settings.md is out of date")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print("docs/settings.md is out of date: run .venv/bin/python docs/gen_settings.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
