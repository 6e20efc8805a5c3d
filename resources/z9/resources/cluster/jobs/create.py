"""ClusterCreate: a new Kubernetes cluster's members made, bootstrapped and verified Ready.

The four phases are the shared converge (:mod:`z9.resources.cluster.jobs.shared`, whose docstring says
how bootstrap data reaches the members — a NoCloud ISO — and why): ``init`` cp-0, ``join`` every
other member in parallel, ``detach_bootstrap``. The cluster becomes ``running`` (every member a
Ready node); a member whose cloud-init fails makes the job fail naming it and its error text, and
the cluster ``failed`` — except a join refused for its expired token, which is re-run with a new one. A DELETE of the cluster supersedes this job at its next step (``cancelled``).
"""
from __future__ import annotations

from typing import Any

from z9.common.errors import TemporaryError

from z9.executor.context import JobContext
from z9.resources.cluster.jobs import shared as _cluster
from z9.resources.cluster import CLUSTER_CREATE

KIND = CLUSTER_CREATE
observe, plan, apply, record_failure = _cluster.observe, _cluster.plan, _cluster.apply, _cluster.record_failure


async def verify(ctx: JobContext) -> _cluster.Seen:
    """Every desired member a Ready node (else TemporaryError: the next attempt converges)."""
    seen = await _cluster.verify(ctx)
    if seen.members and not seen.whole:
        raise TemporaryError("verify: members not Ready yet: " + ", ".join(seen.missing))
    return seen


async def record(conn: Any, ctx: JobContext, seen: _cluster.Seen) -> None:
    await _cluster.record_seen(conn, ctx, seen)
