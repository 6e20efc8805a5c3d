"""``z9 tokens create|list|revoke`` (API tokens of your tenant; the operator scope is granted
only by the operator command ``z9 token``)."""
from __future__ import annotations

import argparse
from typing import Any

from ..cli import Ctx, OK, table
from ..models import Token, TokenCreate
from ._group import group, verb


def tokens_table(tokens: list[Token]) -> Any:
    return table(("ID", "NAME", "SCOPES", "CREATED", "EXPIRES", "LAST USED", "REVOKED"),
                 [(t.id, t.name, ",".join(t.scopes), t.created_at, t.expires_at or "never", t.last_used_at or "-",
                   t.revoked_at or "") for t in tokens])


def create(ctx: Ctx) -> int:
    a = ctx.args
    spec = TokenCreate(name=a.name, scopes=a.scope or ["read", "write"], expires_in_s=a.expires_in)
    made = ctx.client.create_token(spec)
    ctx.emit(made, lambda: table(("field", "value"), [
        ("id", made.token.id), ("name", made.token.name), ("scopes", ",".join(made.token.scopes)),
        ("expires", made.token.expires_at or "never"), ("secret", made.secret)]))
    if not ctx.json:
        ctx.err.print("the secret is shown this once: store it now", highlight=False)
    return OK


def list_(ctx: Ctx) -> int:
    tokens: list[Token] = []
    after = None
    while True:
        page = ctx.client.list_tokens(include_revoked=ctx.args.include_revoked, after=after, limit=500)
        tokens += page.items
        after = page.next_after
        if after is None:
            break
    ctx.emit({"tokens": tokens}, lambda: tokens_table(tokens))
    return OK


def revoke(ctx: Ctx) -> int:
    t = ctx.client.revoke_token(ctx.args.id)
    ctx.emit({"token": t}, lambda: tokens_table([t]))
    return OK


def register(sub: Any, common: argparse.ArgumentParser, waiting: argparse.ArgumentParser) -> str:
    verbs = group(sub, "tokens", "API tokens of your tenant: create, list, revoke")
    p = verb(verbs, "create", "create a token (its secret is shown once)", [common])
    p.add_argument("--name", required=True)
    p.add_argument("--scope", action="append", choices=("read", "write"),
                   help="repeatable; default read and write (never more than the token in use has)")
    p.add_argument("--expires-in", type=int, metavar="SECONDS", help="it stops working after this (≥ 60)")
    p.set_defaults(run=create)
    p = verb(verbs, "list", "list tokens with their last use", [common])
    p.add_argument("--include-revoked", action="store_true")
    p.set_defaults(run=list_)
    p = verb(verbs, "revoke", "revoke a token (refused within the API's token cache time, 5 s)", [common])
    p.add_argument("id")
    p.set_defaults(run=revoke)
    return "tokens"
