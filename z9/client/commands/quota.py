"""``z9 quota show``: your tenant's quotas — each limit (none: no limit) and what you use
(``GET /v1/quota``). The operator's ``z9 quota --tenant NAME [--servers N …]`` sets them (it talks
to the database); ``show`` is its customer side, through the API."""
from __future__ import annotations

import argparse
from typing import Any

from ..cli import OK, Ctx, table


def show(ctx: Ctx) -> int:
    q = ctx.client.get_quota()
    ctx.emit(q, lambda: table(("QUOTA", "LIMIT", "USED", "LEFT"), [
        (k, "none" if v.get("limit") is None else v["limit"], v.get("used"),
         "" if v.get("limit") is None else max(0, v["limit"] - (v.get("used") or 0)))
        for k, v in q.quotas.items()]))
    return OK


def register_show(quota: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """``show`` under the operator's ``z9 quota`` parser (one command name, two sides)."""
    from ..cli import UsageParser

    verbs = quota.add_subparsers(dest="verb", metavar="show", parser_class=UsageParser, required=False)
    p = verbs.add_parser("show", prog="z9 quota show", help="your tenant's quotas and use (the API: GET /v1/quota)",
                         description="your tenant's quotas and use (the API: GET /v1/quota)", parents=[common])
    p.set_defaults(run=show)

