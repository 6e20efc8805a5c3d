"""The ``z9`` command: one subcommand per service, plus ``migrate``, ``token``, ``sim`` and ``dev``.

Every service reads its settings from ``Z9_*`` environment variables (``z9.common.settings``);
command-line flags override the few that differ per process.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Awaitable, Callable

if TYPE_CHECKING:  # imported in main() for an operator command only: a customer command needs no settings
    from z9.common.settings import Settings


async def _serve(service: Any) -> None:
    """Run ``service.run()`` until SIGINT/SIGTERM, which call ``service.stop()``; the process ends
    at the latest ``Z9_SHUTDOWN_GRACE_S`` + 10 s after the signal, or at a second one, whatever it
    waits on (:mod:`z9.common.shutdown`)."""
    from z9.common.shutdown import guard_stop

    guard_stop(service.stop, service.settings.shutdown_grace_s)
    await service.run()


def _run(coro_fn: Callable[[], Awaitable[Any]], runner: Callable[[Any], Any] = asyncio.run) -> int:
    try:
        runner(coro_fn())
    except KeyboardInterrupt:
        pass
    return 0


def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    from z9.api.app import create_app, create_metrics_app
    from z9.api.connections import raise_nofile_limit
    from z9.api.middleware import serve

    from z9.common.errors import PoolConfigError

    settings.require_database_url()
    raise_nofile_limit()  # before the app sizes its connection cap under it
    try:
        return _run(lambda: serve(create_app(settings), args.host or settings.api_host,
                                  args.port or settings.api_port, metrics_app=create_metrics_app(),
                                  metrics_host=settings.metrics_host, metrics_port=settings.metrics_port))
    except PoolConfigError as e:  # the address pools of Z9_REGIONS cannot be written
        print(f"z9 api: {e}", file=sys.stderr)
        return 2


def _serve_metrics(command: str, settings: Settings) -> bool:
    """Serve ``/metrics`` on ``Z9_METRICS_HOST:Z9_METRICS_PORT`` (nothing when the port is 0);
    False (after saying why) when the port cannot be bound."""
    from z9.common import metrics

    try:
        metrics.serve(settings.metrics_host, settings.metrics_port)
    except OSError as e:
        print(f"z9 {command}: cannot serve metrics on {settings.metrics_host}:{settings.metrics_port} "
              f"(Z9_METRICS_HOST/Z9_METRICS_PORT): {e}", file=sys.stderr)
        return False
    return True


def cmd_scheduler(args: argparse.Namespace, settings: Settings) -> int:
    from z9.scheduler import Scheduler

    scheduler = Scheduler(settings)
    if not _serve_metrics("scheduler", settings):
        return 2
    return _run(lambda: _serve(scheduler))


def cmd_reaper(args: argparse.Namespace, settings: Settings) -> int:
    from z9.reaper import Reaper

    reaper = Reaper(settings)
    if not _serve_metrics("reaper", settings):
        return 2
    return _run(lambda: _serve(reaper))


def cmd_executor(args: argparse.Namespace, settings: Settings) -> int:
    from z9.executor.worker import Executor, run_event_loop

    if args.concurrency is not None:
        settings = settings.model_copy(update={"executor_concurrency": args.concurrency})
    regions = args.region or sorted(settings.regions)
    try:
        executor = Executor(settings, regions)
    except ValueError as e:
        print(f"z9 executor: {e}", file=sys.stderr)
        return 2
    if not _serve_metrics("executor", settings):
        return 2
    return _run(lambda: _serve(executor), run_event_loop)


def _database_error(command: str, e: BaseException) -> str:
    """One line saying why ``command`` could not use the database (no traceback)."""
    import asyncpg

    from z9.common.db import NotPrimaryError

    if isinstance(e, asyncpg.InvalidCatalogNameError):
        what = f"the database does not exist ({e})"
    elif isinstance(e, asyncpg.InvalidAuthorizationSpecificationError | asyncpg.InvalidPasswordError):
        what = f"the database refused the login ({e})"
    elif isinstance(e, NotPrimaryError):
        what = str(e)
    elif isinstance(e, asyncpg.PostgresError):
        what = f"the database answered {type(e).__name__}: {e}"
    else:
        what = f"cannot reach the database ({type(e).__name__}: {e or 'no detail'})"
    return f"z9 {command}: {what}"


def _db_command(command: str, coro_fn: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    """Run a one-shot database command; (0, result), or (1, None) after one line on stderr when
    the database is unreachable, refuses the login or answers an error."""
    import asyncpg

    from z9.common.db import TRANSIENT_DB_ERRORS

    from z9.common.errors import DatabaseMisconfigured

    try:
        return 0, asyncio.run(coro_fn())
    except DatabaseMisconfigured as e:
        print(f"z9 {command}: {e}", file=sys.stderr)
        return 2, None
    except (*TRANSIENT_DB_ERRORS, OSError, asyncpg.PostgresError) as e:
        print(_database_error(command, e), file=sys.stderr)
        return 1, None


async def _wait_migrated(dsn: str, wait_s: float) -> list[int]:
    """Poll until every migration this z9 ships is applied (by ``z9 migrate`` elsewhere, e.g. the
    Kubernetes Job); returns the versions still missing at the deadline (empty: up to date)."""
    import asyncpg

    from z9.common.db import connect
    from z9.db import list_migrations

    want = {m.version for m in list_migrations()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        conn = await connect(dsn, application_name="z9-migrate-wait")
        try:
            done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        except asyncpg.UndefinedTableError:
            done = set()
        finally:
            await conn.close()
        missing = sorted(want - done)
        if not missing or loop.time() >= deadline:
            return missing
        await asyncio.sleep(min(2.0, max(0.0, deadline - loop.time())))


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply the migrations, then write the address pools of ``Z9_REGIONS`` to the database
    (``--wait``: apply nothing, wait until another ``z9 migrate`` has applied them)."""
    from z9.common.db import connect, direct_url
    from z9.common.errors import PoolConfigError
    from z9.db import migrate
    from z9.resources.address import store as address_store

    dsn = direct_url(settings)  # never through a transaction pooler: migrate holds a session lock
    if args.wait is not None:  # apply nothing: wait for the schema this version needs
        code, missing = _db_command("migrate", lambda: _wait_migrated(dsn, args.wait))
        if code:
            return code
        if missing:
            print(f"z9 migrate: migrations {missing} are still not applied after {args.wait:g}s "
                  "(is the migrate Job running?)", file=sys.stderr)
            return 1
        print("schema is up to date")
        return 0

    async def go() -> tuple[list[int], list[str]]:
        conn = await connect(dsn, application_name="z9-migrate", primary=True,
                             require_sync_replication=settings.database_require_sync_replication)
        try:
            applied = await migrate(conn)
            pools = await address_store.address_pools_sync(conn, settings.regions)
            return applied, sorted(pools)
        finally:
            await conn.close()

    try:
        code, result = _db_command("migrate", go)
    except PoolConfigError as e:
        print(f"z9 migrate: {e}", file=sys.stderr)
        return 2
    if code == 0:
        applied, pools = result
        print(f"applied migrations: {applied}" if applied else "schema is up to date")
        print(f"address pools: {', '.join(pools)}" if pools else
              "address pools: none in Z9_REGIONS (the database's pools were left as they are)")
    return code


#: tenants.name's CHECK (db/z9/db/schema.sql), checked before connecting so a bad name gets one line.
TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import datetime, timedelta, timezone

    from z9.api.tokens import new_secret, token_tag_key
    from z9.common import store
    from z9.common.db import connect_tool

    if not TENANT_NAME.fullmatch(args.tenant):
        print(f"z9 token: invalid tenant name {args.tenant!r}: 1 to 63 lowercase letters, digits and "
              "'-', starting with a letter or digit", file=sys.stderr)
        return 2
    if not args.name.strip() or len(args.name) > 200:
        print(f"z9 token: invalid token name {args.name!r}: 1 to 200 characters, not only spaces",
              file=sys.stderr)
        return 2
    scopes = args.scope or ["read", "write"]
    expires_at = (datetime.now(timezone.utc) + timedelta(seconds=args.expires_in)
                  if args.expires_in is not None else None)
    async def go() -> str:
        conn = await connect_tool(settings, application_name="z9-token")
        try:
            async with conn.transaction():
                tenant = await store.tenant_upsert(conn, args.tenant)
                token = new_secret(token_tag_key(settings))
                await store.api_token_insert(conn, tenant, token, args.name, scopes=scopes, expires_at=expires_at)
        finally:
            await conn.close()
        return token

    code, token = _db_command("token", go)
    if code == 0:
        print(token)
    return code


def _quota_value(text: str) -> int | None:
    if text == "default":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 0 or 'default', not {text!r}")
    return int(text)


def cmd_quota(args: argparse.Namespace, settings: Settings) -> int:
    """Show a tenant's quotas (limit, where it comes from, current use); set the ones given."""
    from z9 import resources
    from z9.common import store
    from z9.common.db import connect_tool

    if args.tenant is None:
        print("z9 quota: --tenant NAME is needed (your own tenant's quotas, through the API: z9 quota show)",
              file=sys.stderr)
        return 64
    if not TENANT_NAME.fullmatch(args.tenant):
        print(f"z9 quota: invalid tenant name {args.tenant!r}", file=sys.stderr)
        return 2
    units = resources.quota_units()
    given = {k: getattr(args, k) for k in units if getattr(args, k) is not _UNSET}
    if args.running_jobs is not _UNSET:  # not a quota of resources: the engine's cap (RUNNING_JOBS)
        given[RUNNING_JOBS] = args.running_jobs
    async def go() -> tuple[dict[str, Any], dict[str, int]]:
        conn = await connect_tool(settings, application_name="z9-quota")
        try:
            async with conn.transaction():
                tenant = await store.tenant_upsert(conn, args.tenant)
                own = (await store.tenant_quota_set(conn, tenant, given) if given
                       else await store.tenant_quota_limits(conn, tenant))
                used = await resources.quota_usage(conn, tenant, lock=True)
        finally:
            await conn.close()
        return own, used

    code, got = _db_command("quota", go)
    if code == 0:
        own, used = got
        width = max(len("quota"), *(len(k) for k in units))  # the longest unit name (load_balancers)
        print(f"{'quota':<{width}} {'limit':>10} {'source':<9} {'used':>10}")
        for k in units:
            limit = own.get(k, settings.quota_defaults.get(k))
            source = "tenant" if k in own else "default"
            print(f"{k:<{width}} {'none' if limit is None else limit:>10} {source:<9} {used[k]:>10}")
        cap = own.get(RUNNING_JOBS, settings.tenant_max_running_jobs)
        print(f"{RUNNING_JOBS:<{width}} {'none' if cap is None else cap:>10} "
              f"{'tenant' if RUNNING_JOBS in own else 'default':<9} {'-':>10}  (per region, at once)")
    return code


RUNNING_JOBS = "running_jobs"
"""The tenant's own cap on its running jobs per region (a ``tenant_quota_limits`` row the claim
reads, jobs_tenant_room; the default: ``Z9_TENANT_MAX_RUNNING_JOBS``). Not a resource quota: the
API never refuses by it, the claim makes the tenant's jobs wait their turn."""


_UNSET: Any = object()


def cmd_dev(args: argparse.Namespace, settings: Settings) -> int:
    from z9.dev import run_dev

    return run_dev(args, settings)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, not {text!r}")
    return int(text)


class _SectionedHelp(argparse.RawDescriptionHelpFormatter):
    """Lists the subcommands in two sections (customer, operator) instead of one."""

    def _format_action(self, action: argparse.Action) -> str:
        if isinstance(action, argparse._SubParsersAction):
            return ""
        return super()._format_action(action)


OPERATOR_COMMANDS = ("api", "scheduler", "executor", "reaper", "migrate", "token", "quota", "sim", "dev")


def _parser_class() -> type[argparse.ArgumentParser]:
    """``z9``'s own parser: every usage error it reports (an unknown command, a bare ``z9``, an
    unknown flag of an operator command) exits 64, as the customer commands' own do — 2 means
    "deadline" (a wait's), never "usage" — with the command line, its secrets masked."""
    from z9.client.cli import UsageParser

    return UsageParser


#: the connection and output flags of every customer command, which may come before the command
#: as hcloud's and kubectl's do (``z9 --context prod servers list``)
GLOBAL_FLAGS = ("--context", "--api-url", "--token", "-o", "--output")


def hoist_global_flags(argv: list[str]) -> list[str]:
    """``z9 --token T servers list`` → ``z9 servers list --token T``: the connection and output
    flags given before a customer command move after it (every customer command takes them). A
    line whose command is an operator one, or none, is left as it is (its usage error says so)."""
    moved: list[str] = []
    i = 0
    while i < len(argv):
        flag, eq, _ = argv[i].partition("=")
        if flag not in GLOBAL_FLAGS:
            break
        step = 1 if eq else 2
        moved.extend(argv[i:i + step])
        i += step
    rest = argv[i:]
    if not moved or not rest or (rest[0] in OPERATOR_COMMANDS and rest[:2] != ["quota", "show"]):
        return argv
    if "--" in rest:  # the flags go before a `--`, never among the arguments after it
        cut = rest.index("--")
        return [*rest[:cut], *moved, *rest[cut:]]
    return [*rest, *moved]


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The ``z9`` parser. Given the command line about to be parsed (``argv``), ``z9 quota``'s unit
    flags — read from the resource registry, which loads every slice's store — are built only when
    that line is ``z9 quota …``: a customer command starts without the server side (its modules
    are never imported, tests/unit/test_client_imports.py). Without ``argv``: everything."""
    quota_flags = argv is None or argv[:1] == ["quota"]
    from z9.client.redact import MaskingParser

    p = _parser_class()(prog="z9", description="z9 control-plane job system", formatter_class=_SectionedHelp)
    # the operator commands' own parsers keep argparse's exit code (their checks answer 2, as
    # before); the customer groups use z9.client.cli.UsageParser (64); both mask secrets
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=MaskingParser)

    s = sub.add_parser("api", help="serve the REST API")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.set_defaults(fn=cmd_api)

    s = sub.add_parser("scheduler", help="retry backoff and lease expiry")
    s.set_defaults(fn=cmd_scheduler)

    s = sub.add_parser("executor", help="claim and run jobs of one or more regions")
    s.add_argument("--region", action="append", help="region to serve (repeatable; default: all configured)")
    s.add_argument("--concurrency", type=_positive_int, help="jobs run at once (Z9_EXECUTOR_CONCURRENCY)")
    s.set_defaults(fn=cmd_executor)

    s = sub.add_parser("reaper", help="finalise expired deletion buffers")
    s.set_defaults(fn=cmd_reaper)

    s = sub.add_parser("migrate", help="apply database migrations (safe to run concurrently)")
    s.add_argument("--wait", type=float, metavar="SECONDS", default=None,
                   help="apply nothing: wait up to SECONDS until another `z9 migrate` has applied every "
                        "migration of this version (exit 1 if not); for init containers")
    s.set_defaults(fn=cmd_migrate)

    s = sub.add_parser("token", help="create an API token for a tenant (created if missing)")
    s.add_argument("--tenant", required=True)
    s.add_argument("--name", default="default")
    s.add_argument("--scope", action="append", choices=("read", "write", "operator"),
                   help="repeatable; default read and write. operator (sees the platform's Proxmox "
                        "details in job steps) is granted only here, never through the API")
    s.add_argument("--expires-in", type=_positive_int, metavar="SECONDS", help="the token stops working after this")
    s.set_defaults(fn=cmd_token)

    if quota_flags:
        from z9 import resources

        units = resources.quota_units()  # each resource type's own (its slice declares them)
    else:
        units = {}
    flags = ["--" + k.replace("_", "-") for k in units] or ["--<unit>"]
    s = sub.add_parser("quota", help="show a tenant's quotas and use; set them (created if missing)",
                       description=f"Quotas: {', '.join(u.unit for u in units.values())} not yet deleted. A "
                                   "tenant's own limit overrides the Z9_QUOTA_* default; 'default' goes back "
                                   "to it. The API answers 403 quota_exceeded past a limit. Customers: "
                                   "`z9 quota show` (your own tenant's, through the API).",
                       usage=f"z9 quota --tenant NAME [{flags[0]} N|default] "
                             + " ".join(f"[{f} …]" for f in flags[1:]) + "\n       z9 quota show [-o json]")
    s.add_argument("--tenant", help="the tenant (required, but for `z9 quota show`)")
    for k, flag in zip(units, flags):
        s.add_argument(flag, dest=k, type=_quota_value, default=_UNSET, metavar="N|default")
    s.add_argument("--running-jobs", dest="running_jobs", type=_quota_value, default=_UNSET, metavar="N|default",
                   help="most of the tenant's jobs running at once per region (the default: "
                        "Z9_TENANT_MAX_RUNNING_JOBS; its jobs wait their turn, nothing is refused)")
    s.set_defaults(fn=cmd_quota)

    from z9.client.cli import common_parents
    from z9.client.commands.quota import register_show

    register_show(s, common_parents()[0])

    sub.add_parser("sim", help="run the Proxmox VE simulator (options: `z9 sim --help`)", add_help=False)

    s = sub.add_parser("dev", help="run the whole stack locally on embedded PostgreSQL and the simulator")
    s.add_argument("--port", type=int, default=8080, help="API port (default 8080)")
    s.add_argument("--sim-port", type=int, default=0, help="simulator port (default: a free one)")
    s.add_argument("--data-dir", default=None, help="state folder (default .z9, or Z9_DATA_DIR)")
    s.add_argument("--task-seconds", type=float, default=1.0, help="simulated task duration (seconds)")
    s.add_argument("--metrics-port", type=int, default=9101,
                   help="first metrics port: scheduler on it, executor +1, reaper +2, api +3 (default 9101)")
    s.set_defaults(fn=cmd_dev)

    from z9.client.cli import register as register_customer_commands

    customer = register_customer_commands(sub)
    helps = {a.dest: a.help for a in sub._choices_actions}
    width = max(len(n) for n in helps)
    p.epilog = (
        "customer commands (the REST API: Z9_API_URL and Z9_TOKEN, or a context; `z9 COMMAND --help`):\n"
        + "".join(f"  {n:<{width}}  {helps[n]}\n" for n in customer)
        + f"  {'quota show':<{width}}  your tenant's quotas and use\n"
        + "\noperator commands (run the services; need Z9_DATABASE_URL):\n"
        + "".join(f"  {n:<{width}}  {helps[n]}\n" for n in OPERATOR_COMMANDS))
    return p


def quota_settings_problem(settings: Settings) -> str | None:
    """Why the ``Z9_QUOTA_<UNIT>`` variables are wrong (a unit no resource type declares: a typo
    would otherwise leave that quota unlimited without a word), or None."""
    from z9 import resources
    from z9.common.settings import QUOTA_ENV_PREFIX

    unknown = resources.unknown_quota_units(settings.quota_defaults)
    if not unknown:
        return None
    known = ", ".join(QUOTA_ENV_PREFIX + u.upper() for u in resources.quota_units())
    return "; ".join(f"{QUOTA_ENV_PREFIX}{u.upper()}: no such quota (the quotas: {known})" for u in unknown)


def settings_error(e: Exception) -> str:
    """One line per wrong setting, naming its variable (``Z9_DATABASE_URL: …``), without the value
    given (pydantic's own text quotes it: a connection string's password, a token secret)."""
    import pydantic

    if not isinstance(e, pydantic.ValidationError):
        return str(e)
    out = []
    for err in e.errors(include_url=False, include_input=False):
        loc = [str(x) for x in err.get("loc", ())]
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        if loc[:1] == ["quota_defaults"] and len(loc) == 2:  # read from Z9_QUOTA_<UNIT>
            loc = [f"quota_{loc[1]}"]
        out.append(f"Z9_{loc[0].upper()}{''.join(f'[{x}]' for x in loc[1:])}: {msg}" if loc else msg)
    return "; ".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:  # the simulator has its own options (`z9 sim --help`)
        from z9.sim.server import main as sim_main

        return sim_main(argv[1:])
    from z9.client.redact import remember

    remember(argv)  # as typed: its secrets are masked in any usage error, which shows it
    argv = hoist_global_flags(list(argv))
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command not in OPERATOR_COMMANDS or hasattr(args, "run"):  # a customer command: the API, no settings
        from z9.client.cli import run as run_customer_command

        return run_customer_command(args)
    from z9.common.logs import setup_logging
    from z9.common.settings import Settings
    from z9.common.tracing import setup_tracing

    try:
        settings = Settings()
    except Exception as e:  # pydantic ValidationError: say which variable is wrong
        print(f"z9: invalid settings: {settings_error(e)}", file=sys.stderr)
        return 2
    problem = quota_settings_problem(settings)
    if problem:
        print(f"z9: invalid settings: {problem}", file=sys.stderr)
        return 2
    if args.command != "sim":
        # z9 dev talks to a terminal: text, unless Z9_LOG_FORMAT says otherwise
        fmt = "text" if args.command == "dev" and "Z9_LOG_FORMAT" not in os.environ else settings.log_format
        setup_logging(args.command, settings.log_level, fmt)
    if args.command == "dev":  # a supervisor: each child process sets up its own tracing
        return args.fn(args, settings)
    try:
        tracer = setup_tracing(args.command)  # OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set
    except ValueError as e:
        print(f"z9: invalid tracing settings: {e}", file=sys.stderr)
        return 2
    from z9.common.errors import DatabaseMisconfigured

    try:
        return args.fn(args, settings)
    except DatabaseMisconfigured as e:  # the service refuses to run: say why in one line
        print(f"z9 {args.command}: {e}", file=sys.stderr)
        return 2
    finally:
        tracer.shutdown()  # flush the spans still queued
