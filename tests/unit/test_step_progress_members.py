"""Steps carry the member they act on, and the client's progress without a terminal is one line
per step transition: an lb-ha create (two appliances whose steps share their names) followed
through its long-poll answers prints each step's each new state once, named by its member, with
that member's own vmid and node — never a step flipping between pending and done because another
member's step of the same name moved."""
from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from z9.common.models import public_steps
from z9.executor.context import Step

from z9.client.commands.jobs import job_table
from z9.client.models import Job
from z9.client.progress import StepProgress

NAMES = ("clone", "configure", "resize_disk", "start", "push_keepalived", "push_haproxy")
MEMBERS = ("lb-0", "lb-1")


def _steps(done_upto: int) -> list[dict[str, Any]]:
    """The plan's steps (lb-0's then lb-1's, 12, plus the VIP's 3), the first ``done_upto`` done
    and the next one running."""
    plan = [(m, n) for m in MEMBERS for n in NAMES] + [(None, "vip_assign"), (None, "verify_config"),
                                                        (None, "health")]
    out = []
    for i, (member, name) in enumerate(plan):
        state = "done" if i < done_upto else "running" if i == done_upto else "pending"
        detail = {"member": member} if member else {}
        if name == "clone" and state != "pending":
            detail.update(vmid=100 + MEMBERS.index(member), node=f"pve{1 + MEMBERS.index(member)}")
        at = "2026-12-01T04:00:00Z" if state != "pending" else None
        out.append({"name": name, "state": state, "started_at": at,
                    "finished_at": at if state == "done" else None, "detail": detail})
    return out


def _job(steps: list[dict[str, Any]], status: str = "running") -> Job:
    return Job.model_validate({"id": "job_01jd3x5v8q2m6n4p7r9s1t3w5y", "kind": "LoadBalancerCreate",
                               "region": "dev-1", "status": status, "attempt": 1, "max_attempts": 10,
                               "steps": public_steps(steps), "created_at": datetime.now(UTC).isoformat()})


def test_progress_without_a_terminal_is_one_line_per_step_transition() -> None:
    buf = io.StringIO()
    progress = StepProgress(Console(file=buf, force_terminal=False, width=200))
    answers = [_steps(n) for n in range(16)]  # each long-poll answer: one more step done
    answers.insert(5, answers[4])  # an answer with nothing changed
    for steps in answers:
        progress.update(_job(steps))
    progress.update(_job(_steps(15), "succeeded"))
    progress.close()
    lines = buf.getvalue().splitlines()
    step_lines = [x for x in lines if x.startswith("  step ")]
    # each of the 15 steps: pending, running, done — once each (the first answer shows step 0 running)
    assert len(step_lines) == 15 * 3 - 1, "\n".join(lines)
    assert len(set(step_lines)) == len(step_lines), "a line repeated"
    assert [x for x in lines if not x.startswith("  step ")] == [
        "job_01jd3x5v8q2m6n4p7r9s1t3w5y LoadBalancerCreate: running (attempt 1/10)",
        "job_01jd3x5v8q2m6n4p7r9s1t3w5y LoadBalancerCreate: succeeded (attempt 1/10)"]
    # every member's step named by its member, with its own vmid and node
    assert "  step lb-0 clone: done (0.0s)  vmid=100 node=pve1" in step_lines
    assert "  step lb-1 clone: done (0.0s)  vmid=101 node=pve2" in step_lines
    assert not any("lb-1 clone" in x and "vmid=100" in x for x in step_lines)
    assert "  step vip_assign: done (0.0s)" in step_lines


def test_steps_carry_their_member_through_the_api_the_client_and_jobs_get() -> None:
    assert Step("clone", {"member": "lb-1", "vmid": 101}).as_json()["member"] == "lb-1"
    assert Step("vip_assign").as_json()["member"] is None
    # a row written before steps carried it: the API's answer has it from the detail
    assert public_steps([{"name": "start", "state": "done", "detail": {"member": "cp-0"}}])[0]["member"] == "cp-0"
    assert public_steps([{"name": "start", "state": "done", "detail": {}}])[0]["member"] is None
    job = _job(_steps(15), "succeeded")
    assert [s.member for s in job.steps][:7] == ["lb-0"] * 6 + ["lb-1"]
    buf = io.StringIO()
    Console(file=buf, width=200).print(job_table(job))
    text = buf.getvalue()
    assert "MEMBER" in text and "lb-1" in text
    # a job of one VM: no member column
    buf = io.StringIO()
    Console(file=buf, width=200).print(job_table(_job([{"name": "clone", "state": "done", "detail": {}}])))
    assert "MEMBER" not in buf.getvalue()


def test_on_a_terminal_the_table_has_a_member_column() -> None:
    buf = io.StringIO()
    progress = StepProgress(Console(file=buf, force_terminal=True, width=120))
    progress.update(_job(_steps(7)))
    progress.close()
    assert "member" in buf.getvalue() and "lb-1" in buf.getvalue()
