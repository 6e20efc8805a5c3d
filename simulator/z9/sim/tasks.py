"""A PVE task (a UPID and its log: pve-common PVE::RESTEnvironment fork_worker) and what its worker
does (:class:`TaskPlan`): a leaf module the cluster and the storage both use."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable


@dataclass
class Task:
    upid: str
    node: str
    pid: int
    pstart: int
    starttime: int
    type: str
    id: str
    user: str
    visible_at: float  # monotonic seconds
    status: str = "running"
    exitstatus: str | None = None
    endtime: int | None = None
    lines: list[str] = field(default_factory=list)
    warnings: int = 0  # ``warn`` in a worker: "WARN: <text>" lines, the task ends "WARNINGS: n"

    def warn(self, text: str) -> None:
        self.lines.append(f"WARN: {text}")
        self.warnings += 1

    def status_json(self) -> dict:
        user, _, tokenid = self.user.partition("!")
        d: dict[str, Any] = {"upid": self.upid, "node": self.node, "pid": self.pid, "pstart": self.pstart,
                             "starttime": self.starttime, "type": self.type, "id": self.id, "user": user,
                             "status": self.status}
        if tokenid:
            d["tokenid"] = tokenid
        if self.status == "stopped":
            d["exitstatus"] = self.exitstatus
        return d

    def to_json(self) -> dict:
        return {**self.status_json(), "endtime": self.endtime, "log": list(self.lines)}


@dataclass
class TaskPlan:
    """What a worker does: ``run`` does the checks and the work (raising PveError to fail),
    ``cleanup`` runs when the task did not succeed (e.g. remove a clone's placeholder config)."""

    run: Callable[["Task"], Awaitable[None]]
    cleanup: Callable[[], None] | None = None
