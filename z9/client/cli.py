"""The customer commands of ``z9`` (``servers``, ``jobs``, ``tokens``, ``context``): the REST API
through :class:`z9.client.Client`, no database access.

Each resource is a module of :mod:`z9.client.commands` with a ``register(sub, parents)``
function; a later resource (addresses, load balancers, clusters) is one more module in
``COMMANDS``, and a later server action (start, stop, …) one more :func:`add_action` line.

Exit codes (the seeds' ``wait_for_job``, and more): 0 done (with ``--wait``: the job succeeded),
1 the job failed (its error on stderr), 2 the ``--timeout`` deadline passed (default 30 min),
3 the API refused the request (a 409 prints the precondition; never retried), 4 configuration
missing or API unreachable, 64 bad command-line usage.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from .api import ApiError, Client, Conflict, Deadline, Unreachable
from .config import ConfigError, resolve
from .models import Accepted, Job
from .progress import StepProgress

OK, FAILED, DEADLINE, REFUSED, UNREACHABLE, USAGE = 0, 1, 2, 3, 4, 64
DEFAULT_TIMEOUT_S = 1800.0


class UsageParser(argparse.ArgumentParser):
    """Customer commands exit 64 on a usage error: 2 means "deadline" (the seeds' convention)."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"{self.prog}: error: {message}\n")


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
            self._client = Client(t.api_url, t.token)
        return self._client

    @property
    def json(self) -> bool:
        return self.args.output == "json"

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

def follow(ctx: Ctx, job_id: str) -> int:
    """Follow a job to its end with live step progress; the exit code of its outcome."""
    progress = StepProgress(ctx.err)
    timeout = ctx.args.timeout
    try:
        job = ctx.client.wait_job(job_id, timeout_s=timeout, on_change=progress.update)
    except Deadline as d:
        progress.close()
        ctx.err.print(f"deadline: job {job_id} is still {d.job.status} after {timeout:g}s "
                      f"(follow it with: z9 jobs wait {job_id})", highlight=False, soft_wrap=True)
        return DEADLINE
    finally:
        progress.close()
    return outcome(ctx, job)


def outcome(ctx: Ctx, job: Job) -> int:
    if job.status == "succeeded":
        return OK
    err = job.error
    ctx.err.print(f"job {job.id} ({job.kind}) failed: "
                  + (f"{err.class_}: {err.message}" if err else "no error recorded"), highlight=False, soft_wrap=True)
    return FAILED


def mutation(ctx: Ctx, accepted: Accepted[Any], show: Callable[[Any], Table], refetch: Callable[[], Any]) -> int:
    """After a 202: without ``--wait`` print the resource and its job; with it, follow the job
    and print the resource as it then is."""
    if not ctx.args.wait:
        ctx.emit({"resource": accepted.resource, "job": accepted.job},
                 lambda: _accepted_table(accepted, show))
        return OK
    ctx.err.print(f"{accepted.job.kind} {accepted.job.id} accepted; waiting (deadline {ctx.args.timeout:g}s)",
                  highlight=False, soft_wrap=True)
    code = follow(ctx, accepted.job.id)
    for more in accepted.jobs[1:]:  # the request's other jobs (the API's `jobs`): done when all are
        if code != OK:
            break
        ctx.err.print(f"{more.kind} {more.id}: waiting", highlight=False, soft_wrap=True)
        code = follow(ctx, more.id)
    if code in (OK, FAILED):
        resource = refetch()
        ctx.emit({"resource": resource, "job": ctx.client.get_job(accepted.job.id)}, lambda: show(resource))
    return code


def _accepted_table(accepted: Accepted[Any], show: Callable[[Any], Table]) -> Any:
    from rich.console import Group
    from rich.text import Text

    return Group(show(accepted.resource), Text(f"job {accepted.job.id} ({accepted.job.kind}): {accepted.job.status}"
                                               f" — follow it with: z9 jobs wait {accepted.job.id}"))


def add_action(sub: Any, parents: list[argparse.ArgumentParser], name: str, help: str,
               call: Callable[[Client, str], Accepted[Any]], show: Callable[[Any], Table],
               refetch: Callable[[Client, str], Any], id_help: str = "the resource's id") -> argparse.ArgumentParser:
    """A subcommand ``NAME ID [--wait]`` that calls ``call(client, id)`` (a 202) and follows
    its job like every mutation."""
    p = sub.add_parser(name, help=help, description=help, parents=parents)
    p.add_argument("id", help=id_help)

    def run(ctx: Ctx) -> int:
        return mutation(ctx, call(ctx.client, ctx.args.id), show, lambda: refetch(ctx.client, ctx.args.id))

    p.set_defaults(run=run)
    return p


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
        err.print(f"z9: {e}", highlight=False, markup=False)
        return UNREACHABLE
    except Unreachable as e:
        err.print(f"z9: {e.message}", highlight=False, markup=False)
        return UNREACHABLE
    except Conflict as e:
        err.print(f"refused (409 {e.code}): {e.message}", highlight=False, markup=False)
        return REFUSED
    except ApiError as e:
        err.print(f"refused ({e.status} {e.code}): {e.message}", highlight=False, markup=False)
        return REFUSED
    except ValidationError as e:  # the request body, checked by the API's own model before sending
        for x in e.errors(include_url=False, include_input=False):  # one line per field, as the API answers
            field = ".".join(str(part) for part in x.get("loc", ())) or "request"
            err.print(f"invalid request: {field}: {str(x.get('msg', '')).removeprefix('Value error, ')}",
                      highlight=False, markup=False)  # a pattern's [a-z0-9] is not markup
        return USAGE
    except KeyboardInterrupt:
        return 130
