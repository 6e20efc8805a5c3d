"""No secret in a usage error: the command line as the user typed it, with every secret masked.

A usage error (argparse's ``error``) may quote what was typed — ``unrecognized arguments: --token
z9t_…``, ``invalid choice: 'z9t_…'`` — and prints the command line for the user to see what was
parsed. Every such text goes through :func:`redact` first, which knows the secrets of the command
line being parsed (:func:`remember`):

- the value of every secret-bearing flag (:data:`SECRET_FLAGS`: ``--token``), in each form argparse
  accepts: ``--token S``, ``--token=S`` and their unambiguous abbreviations (``--tok S``), whichever
  command the flag was given to (a flag given to the wrong command is still a secret);
- the password of a URL with credentials (``https://user:password@host``), wherever it appears;
- anything that looks like a z9 token (``z9t_…``), wherever it appears (a token typed where a
  positional argument goes).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

#: the flags whose value is a secret (every parser of ``z9`` that defines one of these treats its
#: value as secret; tests/unit/test_usage_errors_mask_secrets.py finds them by what they are)
SECRET_FLAGS = ("--token",)
MASK = "***"
_TOKEN = re.compile(r"z9t_[A-Za-z0-9_\-.]+")
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^/@:\s]*):(?P<password>[^/@\s]*)@")

_argv: list[str] = []


def _is_secret_flag(text: str) -> bool:
    """``--token`` or an abbreviation argparse would expand to it (``--tok``; ``--t`` too: masking
    one value too many costs nothing)."""
    return len(text) > 2 and text.startswith("--") and any(f.startswith(text) for f in SECRET_FLAGS)


def secrets_in(argv: Sequence[str]) -> list[str]:
    """The secret values on a command line, longest first."""
    found: list[str] = []
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if eq and _is_secret_flag(flag):
            found.append(value)
        elif _is_secret_flag(arg) and i + 1 < len(argv):
            found.append(argv[i + 1])
        found.extend(m.group("password") for m in _URL_CREDENTIALS.finditer(arg))
        found.extend(_TOKEN.findall(arg))
    return sorted({s for s in found if s}, key=len, reverse=True)


def mask_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with every secret replaced by :data:`MASK`."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if eq and _is_secret_flag(flag):
            out.append(f"{flag}={MASK}")
            continue
        hide_next = _is_secret_flag(arg)
        out.append(_mask_text(arg))
    return out


def _mask_text(text: str) -> str:
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{m.group('user')}:{MASK}@", text)
    return _TOKEN.sub(MASK, text)


def redact(text: str, argv: Sequence[str] | None = None) -> str:
    """``text`` without any secret of ``argv`` (default: the command line :func:`remember` saw).
    A long secret is masked wherever it appears; a short one (a test's ``--token t``) where it
    stands as a word of its own, so that the usage around it stays readable."""
    for secret in secrets_in(_argv if argv is None else argv):
        if len(secret) >= 8:
            text = text.replace(secret, MASK)
        else:
            text = re.sub(rf"(?<![^\s'\"=,(\[]){re.escape(secret)}(?![^\s'\"),\]:])", MASK, text)
    return _mask_text(text)


def remember(argv: Sequence[str]) -> None:
    """The command line about to be parsed (its secrets are masked in every usage error)."""
    _argv[:] = list(argv)


def command_line(prog: str = "z9") -> str:
    """The remembered command line, its secrets masked, as a shell would take it back."""
    import shlex

    hole = "Z9MASKEDSECRET"  # quoted as a word would be, then shown as MASK
    return " ".join([prog, *(shlex.quote(a.replace(MASK, hole)).replace(hole, MASK) for a in mask_argv(_argv))])


class MaskingParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors mask every secret of the command line and show
    that command line, masked; exits :attr:`usage_exit` (argparse's 2 by default)."""

    usage_exit = 2

    def error(self, message: str) -> Any:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(self.usage_exit, f"{self.prog}: error: {redact(message)}\ncommand line: {command_line()}\n")
