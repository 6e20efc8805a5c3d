"""``z9 jobs get|wait|list|cancel|rerun``. ``list`` is newest first (``--oldest``: oldest),
without the periodic observe-only jobs unless ``--include-observe`` (or ``--kind`` names one), and
says on stderr how to get the next page."""
from __future__ import annotations

import argparse
import time
from typing import Any

from ..cli import DEADLINE, OK, Ctx, follow, table
from ..models import Job
from ._group import group, verb


def job_table(j: Job) -> Any:
    from rich.console import Group

    head = table(("field", "value"), [r for r in (
        ("id", j.id), ("kind", j.kind), ("status", j.status), ("attempt", f"{j.attempt}/{j.max_attempts}"),
        ("resource", f"{j.resource.type} {j.resource.id}" if j.resource else None), ("region", j.region),
        ("error", f"{j.error.class_}: {j.error.message}" if j.error else None), ("actor", j.actor),
        ("request id", j.request_id), ("created", j.created_at), ("finished", j.finished_at)) if r[1] is not None])
    members = any(s.member for s in j.steps)  # a multi-VM resource's job: which member each step acts on
    steps = table(("STEP", *(("MEMBER",) if members else ()), "STATE", "STARTED", "FINISHED"),
                  [(s.name, *((s.member or "",) if members else ()), s.state, s.started_at, s.finished_at)
                   for s in j.steps])
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
    if code != DEADLINE:
        j = ctx.client.get_job(ctx.args.id)
        ctx.emit(j, lambda: job_table(j))
    return code


def list_(ctx: Ctx) -> int:
    a = ctx.args
    jobs: list[Job] = []
    after = a.after
    while True:
        page = ctx.client.list_jobs(resource_id=a.resource, actor=a.actor, limit=a.limit, after=after,
                                    order="oldest" if a.oldest else "newest", status=a.status, kind=a.kind,
                                    include_observe=True if a.include_observe or a.kind else False)
        jobs += page.items
        after = page.next_after
        if not a.all or after is None:
            break
    ctx.emit({"jobs": jobs, "next_after": after}, lambda: jobs_table(jobs))
    if after and not ctx.json:
        again = " ".join(x for x in ("--oldest" if a.oldest else "", "--include-observe" if a.include_observe else "",
                                     f"--status {a.status}" if a.status else "", f"--kind {a.kind}" if a.kind else "",
                                     f"--resource {a.resource}" if a.resource else "",
                                     f"--actor {a.actor}" if a.actor else "") if x)
        ctx.err.print(f"more: z9 jobs list {again + ' ' if again else ''}--after {after} (or --all)", highlight=False)
    return OK


def cancel(ctx: Ctx) -> int:
    j = ctx.client.cancel_job(ctx.args.id)
    ctx.emit({"job": j}, lambda: job_table(j))  # the API's answer: {"job": …}
    return OK


def rerun(ctx: Ctx) -> int:
    made = ctx.client.rerun_job_all(ctx.args.id)
    j = made[0]
    if not ctx.args.wait:
        ctx.emit({"job": j, "jobs": made}, lambda: job_table(j))  # the API's answer: {"job": …, "jobs": […]}
        return OK
    deadline = time.monotonic() + ctx.args.timeout
    for x in made:  # every job the re-run made, within one deadline
        code = follow(ctx, x.id, max(0.001, deadline - time.monotonic()))
        if code != OK:
            break
    if code != DEADLINE:
        done = ctx.client.get_job(j.id)
        ctx.emit({"job": done}, lambda: job_table(done))
    return code


def register(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
    verbs = group(sub, "jobs", "jobs: get, wait, list, cancel, rerun")
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

    p = verb(verbs, "list", "list jobs, newest first (the periodic observe-only jobs left out unless asked for)",
             [common])
    p.add_argument("--resource", help="only the jobs of this resource id")
    p.add_argument("--actor", help="only the jobs asked for by this token id ('me': the token in use)")
    p.add_argument("--status", choices=("pending", "running", "retry", "succeeded", "failed"))
    p.add_argument("--kind", help="only the jobs of this kind, e.g. ServerCreate")
    p.add_argument("--include-observe", action="store_true",
                   help="the periodic observe-only jobs (LoadBalancerObserve, ClusterObserve) too")
    p.add_argument("--oldest", action="store_true", help="oldest first")
    p.add_argument("--limit", type=int, help="page size (1-500, default 100)")
    p.add_argument("--after", help="the next_after of the previous page")
    p.add_argument("--all", action="store_true", help="every page")
    p.set_defaults(run=list_)

    p = verb(verbs, "cancel", "cancel a pending or retrying job (it ends failed, error class cancelled)", [common])
    p.add_argument("id")
    p.set_defaults(run=cancel)
    p = verb(verbs, "rerun", "re-run a failed job's intent as a new job", [common, waiting])
    p.add_argument("id")
    p.set_defaults(run=rerun)
    return "jobs"
