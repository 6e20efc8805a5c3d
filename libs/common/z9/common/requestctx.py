"""Who is asking, for the code that writes jobs: the API token and the request id of the API
request being served, in context variables (each aiohttp request runs in its own task, so
they never leak between requests). Outside a request both are None.

Set by the API's middlewares (``z9.api.tokens``, ``z9.api.middleware``); read by
:class:`z9.common.store.NewJob`, whose defaults record them on every job a request makes —
so handlers need not pass them along.
"""
from __future__ import annotations

from contextvars import ContextVar

ACTOR_TOKEN_ID: ContextVar[str | None] = ContextVar("z9_actor_token_id", default=None)
REQUEST_ID: ContextVar[str | None] = ContextVar("z9_request_id", default=None)


def current_actor() -> str | None:
    """The id of the API token whose request is being served (None outside a request)."""
    return ACTOR_TOKEN_ID.get()


def current_request_id() -> str | None:
    """The ``X-Request-Id`` of the request being served (None outside a request)."""
    return REQUEST_ID.get()
