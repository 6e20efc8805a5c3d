"""Live display of a job's steps while ``--wait`` follows it (on stderr, so ``--output json``
keeps stdout clean).

On a terminal: a ``rich`` live table (status line, one row per step — with the member it acts on,
for a load balancer's or a cluster's — its state and time), redrawn on every change the long-poll
reports. Elsewhere (a pipe, CI logs): one line per transition (the job's status or attempt; a step
entering a new state, named by its member and name: ``lb-1 start: done``), nothing redrawn and
nothing repeated: a step is known by its place in the attempt's plan, so two steps of one name
(each member's ``clone``) never take each other's state, vmid or node.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .models import Job, Step

_STATE_STYLE = {"pending": "dim", "running": "yellow", "done": "green", "failed": "red", "skipped": "dim"}
_STATUS_STYLE = {"pending": "dim", "running": "yellow", "retry": "magenta", "succeeded": "green", "failed": "red"}


def _secs(step: Step) -> str:
    if step.started_at is None:
        return ""
    end = step.finished_at or datetime.now(timezone.utc)
    return f"{(end - step.started_at).total_seconds():.1f}s"


def _detail(step: Step) -> str:
    d = step.detail or {}
    parts = [f"{k}={d[k]}" for k in ("vmid", "node") if d.get(k) is not None]
    if d.get("upid"):
        parts.append("task " + str(d["upid"]).split(":")[5] if str(d["upid"]).count(":") >= 6 else "task")
    return " ".join(parts)


class StepProgress:
    """``update(job)`` on every change; ``close()`` at the end."""

    def __init__(self, console: Console):
        self.console = console
        self.live: Live | None = None
        self.t0 = time.monotonic()
        self._seen: dict[tuple[int, int, str | None, str], str] = {}
        self._status: tuple[str, int] | None = None

    def update(self, job: Job) -> None:
        if self.console.is_terminal:
            if self.live is None:
                self.live = Live(self._render(job), console=self.console, refresh_per_second=4, transient=False)
                self.live.start()
            else:
                self.live.update(self._render(job))
            return
        if (job.status, job.attempt) != self._status:
            self._status = (job.status, job.attempt)
            extra = f" (attempt {job.attempt}/{job.max_attempts})" if job.attempt else ""
            if job.status == "retry" and job.error is not None:
                extra += f": {job.error.message}"
            self.console.print(f"{job.id} {job.kind}: {job.status}{extra}", highlight=False, soft_wrap=True)
        for i, step in enumerate(job.steps):
            key = (job.attempt, i, step.member, step.name)  # its place in this attempt's plan
            if self._seen.get(key) != step.state:
                self._seen[key] = step.state
                tail = f" ({_secs(step)})" if step.state in ("done", "failed") and _secs(step) else ""
                detail = _detail(step)
                who = f"{step.member} " if step.member else ""
                self.console.print(f"  step {who}{step.name}: {step.state}{tail}" + (f"  {detail}" if detail else ""),
                                   highlight=False, soft_wrap=True)

    def _render(self, job: Job) -> Any:
        head = Text.assemble((f"{job.kind} ", "bold"), (job.id, "cyan"), " · ",
                             (job.status, _STATUS_STYLE.get(job.status, "")),
                             f" · attempt {job.attempt}/{job.max_attempts}" if job.attempt else "",
                             f" · {time.monotonic() - self.t0:.0f}s")
        members = any(step.member for step in job.steps)
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        if members:
            table.add_column("member")
        table.add_column("step")
        table.add_column("state")
        table.add_column("time", justify="right")
        table.add_column("detail")
        for step in job.steps:
            table.add_row(*((step.member or "",) if members else ()), step.name,
                          Text(step.state, _STATE_STYLE.get(step.state, "")), _secs(step), _detail(step))
        parts: list[Any] = [head]
        if job.steps:
            parts.append(table)
        if job.error is not None and job.status == "retry":
            parts.append(Text(f"retrying: {job.error.message}", "magenta"))
        return Group(*parts)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
