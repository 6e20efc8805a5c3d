"""Fault injection for the simulator (admin API ``/_sim/faults``).

A rule: ``{"method": "POST"|"*", "path": "<regex searched in the concrete path after /api2/json>",
"action": "error"|"delay"|"drop"|"fail_task", "status": 500, "reason": "...", "seconds": 2.0,
"exitstatus": "...", "times": K | "probability": p}``.

- ``error``: answer ``status`` with ``reason`` as the reason phrase (PVE style body) without doing
  anything (e.g. 595 ``Connection refused``, 500 ``can't lock file ... - got timeout``).
- ``delay``: sleep ``seconds`` (float), then handle normally (client read timeouts).
- ``drop``: handle normally, then close the connection without a response (the client sees a
  connection error while the effect happened; facts: "Where peers broke" 1).
- ``fail_task``: the request returns its UPID, the task runs its duration and ends with
  ``exitstatus`` (default ``can't lock file '/var/lock/qemu-server/lock-<vmid>.conf' - got
  timeout``) without its effect; ``WARNINGS: n`` ends as a success with the effect.

- ``abort`` (uploads): part of the body is read, then the connection is closed: the upload broke off,
  nothing happens (no task, no file).
- ``corrupt`` (uploads): the uploaded bytes are stored with one byte changed (a checksum fails; an ISO
  is unreadable).

``times`` (default 1) counts matches; ``probability`` (0..1) makes the rule fire randomly forever
(until deleted). Rules are checked in creation order; the first that fires wins.
"""

from __future__ import annotations

import itertools
import random
import re
import threading
from typing import Literal

from pydantic import BaseModel, Field, field_validator


class FaultSpec(BaseModel):
    method: str = "*"
    path: str = ".*"
    action: Literal["error", "delay", "drop", "fail_task", "abort", "corrupt"]
    status: int = 500
    reason: str = "simulated failure"
    seconds: float = 0.0
    exitstatus: str | None = None
    times: int | None = Field(default=None, ge=1)
    probability: float | None = Field(default=None, ge=0.0, le=1.0)

    @field_validator("path")
    @classmethod
    def _regex(cls, v: str) -> str:
        re.compile(v)
        return v

    @field_validator("method")
    @classmethod
    def _upper(cls, v: str) -> str:
        return v.upper()


class Fault(BaseModel):
    id: int
    spec: FaultSpec
    remaining: int | None  # None: probabilistic, never exhausted
    hits: int = 0

    def to_json(self) -> dict:
        return {"id": self.id, **self.spec.model_dump(), "remaining": self.remaining, "hits": self.hits}


class FaultStore:
    """Ordered rules; :meth:`match` consumes one use of the first rule that fires."""

    def __init__(self) -> None:
        self._rules: list[Fault] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, spec: FaultSpec) -> Fault:
        remaining = None if spec.probability is not None and spec.times is None else (spec.times or 1)
        f = Fault(id=next(self._ids), spec=spec, remaining=remaining)
        with self._lock:
            self._rules.append(f)
        return f

    def list(self) -> list[dict]:
        return [f.to_json() for f in self._rules]

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def delete(self, fid: int) -> bool:
        with self._lock:
            n = len(self._rules)
            self._rules = [f for f in self._rules if f.id != fid]
            return len(self._rules) != n

    def match(self, method: str, path: str, actions: set[str] | None = None) -> FaultSpec | None:
        """The first rule that fires (``actions``: only rules with one of these actions)."""
        with self._lock:
            for f in self._rules:
                s = f.spec
                if s.method not in ("*", method.upper()) or not re.search(s.path, path):
                    continue
                if actions is not None and s.action not in actions:
                    continue
                if s.probability is not None and random.random() >= s.probability:
                    continue
                f.hits += 1
                if f.remaining is not None:
                    f.remaining -= 1
                    if f.remaining <= 0:
                        self._rules.remove(f)
                return s
        return None
