"""The ``z9`` command: one subcommand per service, plus ``migrate``, ``token``, ``sim`` and ``dev``.

Every service reads its settings from ``Z9_*`` environment variables (``z9.common.settings``);
command-line flags override the few that differ per process.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import sys
from typing import Any, Awaitable, Callable

from z9.common.logs import setup_logging
from z9.common.settings import Settings
from z9.common.tracing import setup_tracing


async def _serve(service: Any) -> None:
    """Run ``service.run()`` until SIGINT/SIGTERM, which call ``service.stop()``."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, service.stop)
    await service.run()


def _run(coro_fn: Callable[[], Awaitable[Any]]) -> int:
    try:
        asyncio.run(coro_fn())
    except KeyboardInterrupt:
        pass
    return 0


def cmd_api(args: argparse.Namespace, settings: Settings) -> int:
    from aiohttp import web

    from z9.api.app import create_app

    from z9.common.errors import PoolConfigError

    settings.require_database_url()
    try:
        web.run_app(create_app(settings), host=args.host or settings.api_host, port=args.port or settings.api_port,
                    print=lambda *_: None, access_log=None)
    except PoolConfigError as e:  # the address pools of Z9_REGIONS cannot be written
        print(f"z9 api: {e}", file=sys.stderr)
        return 2
    return 0


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
    from z9.executor.worker import Executor

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
    return _run(lambda: _serve(executor))


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply the migrations, then write the address pools of ``Z9_REGIONS`` to the database."""
    from z9.common import store
    from z9.common.db import connect
    from z9.common.errors import PoolConfigError
    from z9.db import migrate

    async def go() -> None:
        conn = await connect(settings.require_database_url(), application_name="z9-migrate")
        try:
            applied = await migrate(conn)
            pools = await store.address_pools_sync(conn, settings.regions)
        finally:
            await conn.close()
        print(f"applied migrations: {applied}" if applied else "schema is up to date")
        print(f"address pools: {', '.join(sorted(pools)) or 'none configured'}")

    try:
        asyncio.run(go())
    except PoolConfigError as e:
        print(f"z9 migrate: {e}", file=sys.stderr)
        return 2
    return 0


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    from z9.common import store
    from z9.common.db import connect

    async def go() -> str:
        conn = await connect(settings.require_database_url(), application_name="z9-token")
        try:
            async with conn.transaction():
                tenant = await store.tenant_upsert(conn, args.tenant)
                token = "z9t_" + secrets.token_urlsafe(32)
                await store.api_token_insert(conn, tenant, token, args.name)
        finally:
            await conn.close()
        return token

    print(asyncio.run(go()))
    return 0


def cmd_dev(args: argparse.Namespace, settings: Settings) -> int:
    from z9.dev import run_dev

    return run_dev(args, settings)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ 1, not {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="z9", description="z9 control-plane job system")
    sub = p.add_subparsers(dest="command", required=True)

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
    s.set_defaults(fn=cmd_migrate)

    s = sub.add_parser("token", help="create an API token for a tenant (created if missing)")
    s.add_argument("--tenant", required=True)
    s.add_argument("--name", default="default")
    s.set_defaults(fn=cmd_token)

    sub.add_parser("sim", help="run the Proxmox VE simulator (options: `z9 sim --help`)", add_help=False)

    s = sub.add_parser("dev", help="run the whole stack locally on embedded PostgreSQL and the simulator")
    s.add_argument("--port", type=int, default=8080, help="API port (default 8080)")
    s.add_argument("--sim-port", type=int, default=0, help="simulator port (default: a free one)")
    s.add_argument("--data-dir", default=None, help="state folder (default .z9, or Z9_DATA_DIR)")
    s.add_argument("--task-seconds", type=float, default=1.0, help="simulated task duration (seconds)")
    s.add_argument("--metrics-port", type=int, default=9101,
                   help="first metrics port: scheduler on it, executor +1, reaper +2 (default 9101)")
    s.set_defaults(fn=cmd_dev)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:  # the simulator has its own options (`z9 sim --help`)
        from z9.sim.server import main as sim_main

        return sim_main(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
    except Exception as e:  # pydantic ValidationError: say which variable is wrong
        print(f"z9: invalid settings: {e}", file=sys.stderr)
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
    try:
        return args.fn(args, settings)
    finally:
        tracer.shutdown()  # flush the spans still queued
