"""The customer commands of ``z9`` (``servers``, ``addresses``, ``load-balancers``, ``clusters``,
``jobs``, ``tokens``, ``quota show``, ``context``, …): the REST API
through :class:`z9.client.Client`, no database access.

Each command group is a module of :mod:`z9.client.commands` with a ``register(sub, common,
waiting)`` function; a resource kind's module declares its commands as one
:class:`~z9.client.commands._kind.KindSpec` (columns, fields, create/update flags, actions), so a
later kind is one more module in ``COMMANDS`` and a later action one more ``Action`` line.

Exit codes (the seeds' ``wait_for_job``, and more): 0 done (with ``--wait``: the job succeeded),
1 the job failed (its error on stderr), 2 the ``--timeout`` deadline passed (default 30 min) — and
nothing else, 3 the API refused the request (a 409 prints the precondition; never retried), 4
configuration missing or API unreachable, 64 bad command-line usage (every one: an unknown
command, group or flag, a missing argument).

``-o json`` prints the API's own shapes on stdout and, on stderr, every refusal or failure as
``{"error": {"code", "message", "details"}}`` (the API's error shape; the client's own codes:
``job_failed``, ``deadline``, ``configuration``, ``unreachable``).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from .api import ApiError, Client, Deadline, Unreachable
from .config import ConfigError, max_retries, resolve
from .models import Accepted, Job
from .progress import StepProgress
from .redact import MaskingParser

OK, FAILED, DEADLINE, REFUSED, UNREACHABLE, USAGE = 0, 1, 2, 3, 4, 64
DEFAULT_TIMEOUT_S = 1800.0


class UsageParser(MaskingParser):
    """Customer commands exit 64 on a usage error: 2 means "deadline" (the seeds' convention).
    An unknown argument is reported by the innermost command that got it, with that command's
    usage (not ``z9``'s), and the command line with its secrets masked (:mod:`.redact`)."""

    usage_exit = USAGE

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


@dataclass
class Ctx:
    args: argparse.Namespace
    out: Console  # stdout: results
    err: Console  # stderr: progress, errors
    _client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            t = resolve(api_url=self.args.api_url, token=self.args.token, context=self.args.context)
            self._client = Client(t.api_url, t.token, max_retries=max_retries())
        return self._client

    @property
    def json(self) -> bool:
        return self.args.output == "json"

    def refuse(self, code: str, message: str, details: Any = None) -> None:
        """A refusal or failure on stderr: one line, or ``{"error": …}`` under ``-o json`` — its
        ``details`` a list of objects, as the API's (one object becomes a list of it)."""
        if self.json:
            listed = [] if details is None else details if isinstance(details, list) else [details]
            print(json.dumps({"error": {"code": code, "message": message, "details": to_jsonable(listed)}}),
                  file=sys.stderr)
        else:
            self.err.print(message, highlight=False, markup=False, soft_wrap=True)

    def emit(self, data: Any, table: Callable[[], Table] | None = None) -> None:
        """Print ``data`` as JSON (``--output json``) or as ``table()``."""
        if self.json or table is None:
            self.out.print_json(json.dumps(to_jsonable(data)))
        else:
            # a table is as wide as its rows (as kubectl's and hcloud's): nothing is cut or folded
            # to fit the terminal, so an id can always be copied and `| grep`/`| awk` see whole rows
            t = table()
            natural = Measurement.get(self.out, self.out.options.update_width(100_000), t).maximum
            width = self.out.width
            self.out.width = max(width, natural)
            try:
                self.out.print(t, crop=False)
            finally:
                self.out.width = width


def to_jsonable(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json", by_alias=True)
    if isinstance(data, dict):
        return {k: to_jsonable(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [to_jsonable(v) for v in data]
    return data


#: columns holding ids (table headers, upper case)
ID_COLUMNS = frozenset({"ID", "RESOURCE", "SERVER", "JOB"})


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    t = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for c in columns:
        # ids are copied into the next command: never wrapped
        t.add_column(c, no_wrap=c.upper() in ID_COLUMNS)
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return v


# ---------------------------------------------------------------------------------- waiting

def follow(ctx: Ctx, job_id: str, timeout: float | None = None) -> int:
    """Follow a job to its end with live step progress (at most ``timeout`` seconds, default
    ``--timeout``); the exit code of its outcome."""
    progress = StepProgress(ctx.err)
    timeout = ctx.args.timeout if timeout is None else timeout
    try:
        job = ctx.client.wait_job(job_id, timeout_s=timeout, on_change=progress.update)
    except Deadline as d:
        progress.close()
        ctx.refuse("deadline", f"deadline: job {job_id} is still {d.job.status} after {timeout:g}s "
                               f"(follow it with: z9 jobs wait {job_id})", {"job": d.job.id, "status": d.job.status})
        return DEADLINE
    finally:
        progress.close()
    return outcome(ctx, job)


def outcome(ctx: Ctx, job: Job) -> int:
    if job.status == "succeeded":
        return OK
    err = job.error
    ctx.refuse("job_failed", f"job {job.id} ({job.kind}) failed: "
               + (f"{err.class_}: {err.message}" if err else "no error recorded"),
               {"job": job.id, "kind": job.kind, "error": job.error})
    return FAILED


def mutation(ctx: Ctx, accepted: Accepted[Any], show: Callable[[Any], Table], refetch: Callable[[], Any]) -> int:
    """After a 202: without ``--wait`` print the resource and its job (``-o json``: the API's
    answer, ``{"server": …, "job": …}``); with it, follow the job — and every other job the answer
    lists (``jobs``), within the one deadline — and print the resource as it then is, with the
    finished job (and, when the request made more than one, every one of them as ``jobs``)."""
    if not ctx.args.wait:
        ctx.emit(accepted.api_shape(), lambda: _accepted_table(accepted, show))
        return OK
    ctx.err.print(f"{accepted.job.kind} {accepted.job.id} accepted; waiting (deadline {ctx.args.timeout:g}s)",
                  highlight=False, soft_wrap=True)
    deadline = time.monotonic() + ctx.args.timeout
    ids = accepted.job_ids()
    for job_id in ids:
        code = follow(ctx, job_id, max(0.001, deadline - time.monotonic()))
        if code != OK:
            break
    if code in (OK, FAILED):
        resource = refetch()
        done: dict[str, Any] = {accepted.key: resource, "job": ctx.client.get_job(accepted.job.id)}
        if len(ids) > 1:
            done["jobs"] = [done["job"], *(ctx.client.get_job(i) for i in ids[1:])]
        ctx.emit(done, lambda: show(resource))
    return code


def _accepted_table(accepted: Accepted[Any], show: Callable[[Any], Table]) -> Any:
    from rich.console import Group
    from rich.text import Text

    return Group(show(accepted.resource), Text(f"job {accepted.job.id} ({accepted.job.kind}): {accepted.job.status}"
                                               f" — follow it with: z9 jobs wait {accepted.job.id}"))


# ---------------------------------------------------------------------------------- wiring

def common_parents() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """(options of every customer command, options of every mutation)."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("connection and output")
    g.add_argument("--context", help="config file context to use (default: Z9_CONTEXT, then the current one)")
    g.add_argument("--api-url", help="API base URL, e.g. http://127.0.0.1:8080/v1 (default: Z9_API_URL)")
    g.add_argument("--token", help="API token (default: Z9_TOKEN)")
    g.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format (table)")
    waiting = argparse.ArgumentParser(add_help=False)
    g = waiting.add_argument_group("waiting")
    g.add_argument("--wait", action="store_true",
                   help="follow the job with live step progress; exit 0 succeeded, 1 failed, 2 deadline")
    g.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"deadline of --wait (default {DEFAULT_TIMEOUT_S:g} s = 30 min)")
    return common, waiting


def register(sub: Any) -> list[str]:
    """Add the customer commands to the ``z9`` subparsers; returns their names."""
    from .commands import COMMANDS

    common, waiting = common_parents()
    names = []
    for module in COMMANDS:
        names.append(module.register(sub, common, waiting))
    return names


#: a pattern's refusal in words (never the regex): the API's name and id patterns
_PATTERN_WORDS = (
    (re.compile(r"\^\[a-z0-9\]\(\[a-z0-9-\]\{0,61\}\[a-z0-9\]\)\?\$"),
     "must be a DNS label: lower case letters, digits and inner hyphens, 1 to 63 characters"),
    (re.compile(r"\^([a-z0-9]+)_\[0-9a-z\]\{26\}\$"), "must be an id like {0}_… (26 more characters)"),
)


def problem_text(err: Any) -> str:
    """pydantic's message for one field, a pattern said in words rather than as its regex."""
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    pattern = (err.get("ctx") or {}).get("pattern")
    if err.get("type") == "string_pattern_mismatch" and pattern:
        for regex, words in _PATTERN_WORDS:
            m = regex.fullmatch(str(pattern))
            if m:
                return words.format(*m.groups())
        return "is not in the expected form (see the command's --help)"
    return msg


def flag_of(field: str) -> str | None:
    """The flag the user typed for a request field (``expires_in_s`` → ``--expires-in``), else None."""
    from .redact import _argv

    top = field.split(".")[0].split("[")[0]
    for cand in (top, top.removesuffix("_s"), top.removesuffix("_id"), top.removesuffix("_ids")):
        flag = "--" + cand.replace("_", "-")
        if any(a == flag or a.startswith(flag + "=") for a in _argv):
            return flag
    return None


def run(args: argparse.Namespace) -> int:
    """Run a parsed customer command; map every error to its exit code."""
    out = Console(soft_wrap=True)
    err = Console(stderr=True, soft_wrap=True)
    if not hasattr(args, "run"):
        err.print(f"z9 {args.command}: a subcommand is needed (z9 {args.command} --help)")
        return USAGE
    ctx = Ctx(args, out, err)
    try:
        return args.run(ctx)
    except ConfigError as e:
        ctx.refuse("configuration", f"z9: {e}")
        return UNREACHABLE
    except Unreachable as e:
        ctx.refuse("unreachable", f"z9: {e.message}")
        return UNREACHABLE
    except ApiError as e:  # a 409 (Conflict) too: the precondition, never retried
        if ctx.json:
            print(json.dumps({"error": {"code": e.code, "message": e.message, "details": e.details},
                              "status": e.status}), file=sys.stderr)
        else:
            err.print(f"refused ({e.status} {e.code}): {e.message}", highlight=False, markup=False)
        return REFUSED
    except ValidationError as e:  # the request body, checked by the API's own model before sending
        problems = []
        for x in e.errors(include_url=False, include_input=False):  # one line per field, as the API answers
            field = ".".join(str(part) for part in x.get("loc", ())) or "request"
            problems.append({"field": field, "flag": flag_of(field),
                             "message": problem_text(x)})
        if ctx.json:
            ctx.refuse("validation_error", "; ".join(f"{p['field']}: {p['message']}" for p in problems), problems)
        for p in problems if not ctx.json else ():
            err.print(f"invalid request: {p['flag'] or p['field']}: {p['message']}",
                      highlight=False, markup=False)
        return USAGE
    except KeyboardInterrupt:
        return 130
