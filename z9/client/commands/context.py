"""``z9 context set|use|list|delete|show``: named API targets in the config file."""
from __future__ import annotations

import argparse
from typing import Any

from ..cli import Ctx, OK, USAGE, table
from ..config import ConfigFile, check_api_url, describe, mask, resolve
from ._group import group, verb


def set_(ctx: Ctx) -> int:
    cfg = ConfigFile.load()
    ctxd = cfg.contexts.setdefault(ctx.args.name, {})
    if ctx.args.api_url:
        ctxd["api_url"] = check_api_url(ctx.args.api_url)
    if ctx.args.token:
        ctxd["token"] = ctx.args.token
    if not ctxd.get("api_url") or not ctxd.get("token"):
        ctx.err.print("a new context needs --api-url and --token", highlight=False)
        return USAGE
    if ctx.args.use or cfg.current_context is None:
        cfg.current_context = ctx.args.name
    cfg.save()
    ctx.err.print(f"context {ctx.args.name!r} saved in {cfg.path}"
                  + (" (current)" if cfg.current_context == ctx.args.name else ""), highlight=False)
    return OK


def use(ctx: Ctx) -> int:
    cfg = ConfigFile.load()
    if ctx.args.name not in cfg.contexts:
        ctx.err.print(f"no context {ctx.args.name!r} (z9 context list)", highlight=False)
        return USAGE
    cfg.current_context = ctx.args.name
    cfg.save()
    return OK


def delete(ctx: Ctx) -> int:
    cfg = ConfigFile.load()
    if cfg.contexts.pop(ctx.args.name, None) is None:
        ctx.err.print(f"no context {ctx.args.name!r}", highlight=False)
        return USAGE
    if cfg.current_context == ctx.args.name:
        cfg.current_context = None
    cfg.save()
    return OK


def list_(ctx: Ctx) -> int:
    rows = describe(ConfigFile.load())
    ctx.emit({"contexts": rows}, lambda: table(("", "NAME", "API URL", "TOKEN"),
                                               [("*" if r["current"] else "", r["name"], r["api_url"], r["token"])
                                                for r in rows]))
    return OK


def show(ctx: Ctx) -> int:
    t = resolve(api_url=ctx.args.api_url, token=ctx.args.token, context=ctx.args.context)
    ctx.emit({"api_url": t.api_url, "token": mask(t.token), "from": t.source,
              "api_url_from": t.url_source, "token_from": t.token_source},
             lambda: table(("field", "value"), [("api url", t.api_url), ("api url from", t.url_source),
                                                ("token", mask(t.token)), ("token from", t.token_source)]))
    return OK


def register(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
    verbs = group(sub, "context", "named API targets (URL + token) in the config file, like hcloud/kubectl")
    p = verb(verbs, "set", "add or change a context (the first one becomes current)", [common])
    p.add_argument("name")
    p.add_argument("--use", action="store_true", help="make it the current context")
    p.set_defaults(run=set_)
    p = verb(verbs, "use", "make a context the current one", [common])
    p.add_argument("name")
    p.set_defaults(run=use)
    p = verb(verbs, "delete", "remove a context", [common])
    p.add_argument("name")
    p.set_defaults(run=delete)
    p = verb(verbs, "list", "list contexts (* = current)", [common])
    p.set_defaults(run=list_)
    p = verb(verbs, "show", "the API URL and token a command would use, and where they come from", [common])
    p.set_defaults(run=show)
    return "context"
