"""Where the client finds its API and token: flags, then ``Z9_API_URL``/``Z9_TOKEN``, then the
config file's named context (as ``hcloud`` and ``kubectl`` do) — each of the two on its own, but a
context's token never goes to another URL than the context's (:func:`resolve`).

The file is ``$Z9_CONFIG``, else ``$XDG_CONFIG_HOME/z9/config.toml``, else
``~/.config/z9/config.toml`` (written mode 0600: it holds tokens)::

    current_context = "dev"

    [contexts.dev]
    api_url = "http://127.0.0.1:8080/v1"
    token = "z9t_…"

``z9 context set|use|list|delete`` edit it. ``--context NAME`` (or ``Z9_CONTEXT``) picks another
context for one command.

``Z9_CLIENT_MAX_RETRIES`` (default 5) is how many times a request is retried after a connection
refused or reset, a timeout, a 503 or a 429 (with a growing pause, 0.5 s doubling up to 10 s,
between tries) before the command gives up (``cannot reach``: exit 4): 0 gives up at the first
failure (:func:`max_retries`).
"""
from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class ConfigError(Exception):
    """The configuration is missing or unreadable (the message says what to do)."""


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """``Z9_CONFIG``, else under ``XDG_CONFIG_HOME`` or ``~/.config`` (read from ``env``, default the
    process environment)."""
    env = os.environ if env is None else env
    if env.get("Z9_CONFIG"):
        return Path(env["Z9_CONFIG"])
    base = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "z9" / "config.toml"


@dataclass
class ConfigFile:
    path: Path
    current_context: str | None = None
    contexts: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None = None) -> "ConfigFile":
        path = path or config_path()
        if not path.exists():
            return cls(path)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read {path}: {e}")
        contexts = data.get("contexts", {})
        if not isinstance(contexts, dict) or not all(isinstance(v, dict) for v in contexts.values()):
            raise ConfigError(f"{path}: [contexts.NAME] tables expected")
        return cls(path, data.get("current_context"), {k: {kk: str(vv) for kk, vv in v.items()}
                                                       for k, v in contexts.items()})

    def save(self) -> None:
        lines = []
        if self.current_context:
            lines.append(f"current_context = {_toml_str(self.current_context)}")
        for name in sorted(self.contexts):
            lines.append("")
            lines.append(f"[contexts.{_toml_str(name)}]")
            for k, v in sorted(self.contexts[name].items()):
                lines.append(f"{k} = {_toml_str(v)}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, self.path)


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid TOML basic string


@dataclass(frozen=True)
class Target:
    api_url: str
    token: str
    source: str  # where they came from (for error messages and `z9 context show`)
    url_source: str = ""
    token_source: str = ""


def masked_url(url: str) -> str:
    """``url`` with the password of its credentials (``http://user:password@host``) masked."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^/@:\s]*):[^/@\s]*@", r"\1:***@", url)


def check_api_url(url: str, source: str = "--api-url") -> str:
    """``url`` if it is one an API can be at (``http`` or ``https``, a host, a port 1-65535);
    otherwise :class:`ConfigError` naming ``source`` and the URL, its password masked."""
    shown = masked_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when not 0-65535
    except ValueError as e:
        raise ConfigError(f"{source} is {shown!r}: not a URL ({e}); expected e.g. http://127.0.0.1:8080/v1") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{source} is {shown!r}: an http:// or https:// URL is expected "
                          "(e.g. http://127.0.0.1:8080/v1)")
    if not parts.hostname:
        raise ConfigError(f"{source} is {shown!r}: the URL names no host")
    if port == 0:
        raise ConfigError(f"{source} is {shown!r}: port 0 is no port")
    return url


def resolve(*, api_url: str | None = None, token: str | None = None, context: str | None = None,
            env: dict[str, str] | None = None) -> Target:
    """The API URL and token to use, each from the first of: its flag (``--api-url``,
    ``--token``), its variable (``Z9_API_URL``, ``Z9_TOKEN``), the context (``--context``, else
    ``Z9_CONTEXT``, else the file's current one). A context named explicitly (flag or
    ``Z9_CONTEXT``) beats the variables.

    A context's token is sent only to that context's URL: a URL from a flag or the environment
    with the token left to a context of another URL is refused (:class:`ConfigError` naming both),
    never sent there."""
    env = os.environ if env is None else env
    ctx_name = context or env.get("Z9_CONTEXT")
    url, url_src = (api_url, "--api-url") if api_url else (None, "")
    tok, tok_src = (token, "--token") if token else (None, "")
    if not ctx_name:  # the variables come before the file's current context
        if not url and env.get("Z9_API_URL"):
            url, url_src = env["Z9_API_URL"], "Z9_API_URL"
        if not tok and env.get("Z9_TOKEN"):
            tok, tok_src = env["Z9_TOKEN"], "Z9_TOKEN"
    ctx_label = ""
    if not (url and tok):
        cfg = ConfigFile.load(config_path(env))
        name = ctx_name or cfg.current_context
        if name:
            ctx = cfg.contexts.get(name)
            if ctx is None:
                raise ConfigError(f"no context {name!r} in {cfg.path} (z9 context list)")
            ctx_label = f"context {name!r} of {cfg.path}"
            ctx_url = (ctx.get("api_url") or "").rstrip("/")
            if not tok and ctx.get("token"):
                if url and url.rstrip("/") != ctx_url:
                    raise ConfigError(
                        f"{url_src} is {url} but the token would come from {ctx_label}, whose API is "
                        f"{ctx_url or 'unset'}: a context's token is only sent to its own API. Set Z9_TOKEN (or "
                        f"--token) for {url}, or unset {url_src} to use the context")
                tok, tok_src = ctx["token"], ctx_label
            if not url and ctx_url:
                url, url_src = ctx_url, ctx_label
    if not url or not tok:
        missing = " and ".join(n for n, v in (("Z9_API_URL", url), ("Z9_TOKEN", tok)) if not v)
        raise ConfigError(f"{missing} not set: export them, pass --api-url/--token, or make a context "
                          "(z9 context set NAME --api-url URL --token TOKEN)")
    check_api_url(url, url_src)
    source = url_src if url_src == tok_src else f"api url from {url_src}, token from {tok_src}"
    return Target(url.rstrip("/"), tok, source, url_src, tok_src)


DEFAULT_MAX_RETRIES = 5


def max_retries(env: Mapping[str, str] | None = None) -> int:
    """``Z9_CLIENT_MAX_RETRIES`` (a whole number, 0 or more), else :data:`DEFAULT_MAX_RETRIES`."""
    env = os.environ if env is None else env
    raw = (env.get("Z9_CLIENT_MAX_RETRIES") or "").strip()
    if not raw:
        return DEFAULT_MAX_RETRIES
    if not raw.isdigit():
        raise ConfigError(f"Z9_CLIENT_MAX_RETRIES is {raw!r}: a whole number of retries, 0 or more, expected")
    return int(raw)


def mask(token: str) -> str:
    return token[:8] + "…" if len(token) > 12 else "…"


def describe(cfg: ConfigFile) -> list[dict[str, Any]]:
    return [{"name": n, "current": n == cfg.current_context, "api_url": c.get("api_url"),
             "token": mask(c.get("token", ""))} for n, c in sorted(cfg.contexts.items())]
