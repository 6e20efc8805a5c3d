"""``z9 jobs get|wait|list``."""
from __future__ import annotations

import argparse
from typing import Any

from ..cli import Ctx, OK, follow, table
from ..models import Job
from ._group import group, verb


def job_table(j: Job) -> Any:
    from rich.console import Group

    head = table(("field", "value"), [r for r in (
        ("id", j.id), ("kind", j.kind), ("status", j.status), ("attempt", f"{j.attempt}/{j.max_attempts}"),
        ("resource", f"{j.resource.type} {j.resource.id}" if j.resource else None), ("region", j.region),
        ("error", f"{j.error.class_}: {j.error.message}" if j.error else None), ("actor", j.actor),
        ("request id", j.request_id), ("created", j.created_at), ("finished", j.finished_at)) if r[1] is not None])
    steps = table(("STEP", "STATE", "STARTED", "FINISHED"),
                  [(s.name, s.state, s.started_at, s.finished_at) for s in j.steps])
    return Group(head, steps) if j.steps else head


def jobs_table(jobs: list[Job]) -> Any:
    return table(("ID", "KIND", "STATUS", "ATTEMPT", "RESOURCE", "CREATED", "ERROR"),
                 [(j.id, j.kind, j.status, f"{j.attempt}/{j.max_attempts}", j.resource.id if j.resource else "",
                   j.created_at, j.error.message if j.error else "") for j in jobs])


def get(ctx: Ctx) -> int:
    j = ctx.client.get_job(ctx.args.id)
    ctx.emit(j, lambda: job_table(j))
    return OK


def wait(ctx: Ctx) -> int:
    code = follow(ctx, ctx.args.id)
    if code != 2:
        j = ctx.client.get_job(ctx.args.id)
        ctx.emit(j, lambda: job_table(j))
    return code


def list_(ctx: Ctx) -> int:
    a = ctx.args
    jobs: list[Job] = []
    after = a.after
    while True:
        page = ctx.client.list_jobs(resource_id=a.resource, actor=a.actor, limit=a.limit, after=after)
        jobs += page.items
        after = page.next_after
        if not a.all or after is None:
            break
    ctx.emit({"jobs": jobs, "next_after": after}, lambda: jobs_table(jobs))
    return OK


def register(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
    verbs = group(sub, "jobs", "jobs: get, wait, list")
    p = verb(verbs, "get", "show a job (status, attempt, steps, error)", [common])
    p.add_argument("id")
    p.set_defaults(run=get)

    p = verb(verbs, "wait", "follow a job to its end with live step progress; exit 0 succeeded, 1 failed, "
                            "2 deadline", [common])
    p.add_argument("id")
    from ..cli import DEFAULT_TIMEOUT_S, positive_float

    p.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"deadline (default {DEFAULT_TIMEOUT_S:g} s = 30 min)")
    p.set_defaults(run=wait)

    p = verb(verbs, "list", "list jobs, oldest first", [common])
    p.add_argument("--resource", help="only the jobs of this resource id")
    p.add_argument("--actor", help="only the jobs asked for by this token id ('me': the token in use)")
    p.add_argument("--limit", type=int, help="page size (1-500, default 100)")
    p.add_argument("--after", help="the next_after of the previous page")
    p.add_argument("--all", action="store_true", help="every page")
    p.set_defaults(run=list_)
    return "jobs"
