"""Helpers for a command group: ``z9 <group> <verb> …`` with the customer parser class."""
from __future__ import annotations

import argparse
from typing import Any

from ..cli import UsageParser


def group(sub: Any, name: str, help: str) -> Any:
    """``z9 NAME``: a parser whose verbs are added to the returned subparsers (both exit 64 on
    a usage error, like every customer command)."""
    saved = sub._parser_class
    sub._parser_class = UsageParser
    try:
        p = sub.add_parser(name, help=help, description=help)
    finally:
        sub._parser_class = saved
    return p.add_subparsers(dest="verb", metavar="COMMAND", parser_class=UsageParser, required=True)


def verb(verbs: Any, name: str, help: str, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    return verbs.add_parser(name, help=help, description=help, parents=parents)
