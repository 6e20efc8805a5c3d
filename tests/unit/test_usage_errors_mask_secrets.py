"""No secret in a usage error: every flag of every ``z9`` command that takes a secret (found here
by what it is — a token, a password, a secret, a URL that may carry credentials — not from the
client's own list) is driven through usage errors of every kind, written every way argparse
accepts it (``--token S``, ``--token=S``, an abbreviation, before the command), and neither stdout
nor stderr holds the secret; the command line is printed with the secret masked."""
from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from z9.cli import build_parser, main

SECRET = "z9t_Sup3rS3cretValueThatMustNeverShow.tag1234567890abcdefghij"
URL_PASSWORD = "hunter2-url-password"
SECRETISH = re.compile(r"token|secret|password|passwd|credential|api.?url", re.IGNORECASE)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of a command already walked
                    continue
                seen.add(id(sub))
                yield from _commands(sub, (*path, name))


def secret_flags() -> list[tuple[tuple[str, ...], str, bool]]:
    """(command path, flag, is_url) for every option of every command that takes a secret."""
    found = []
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0:
                continue
            what = " ".join([action.dest, action.help or "", str(action.metavar or "")])
            if SECRETISH.search(what) and "file" not in action.dest:  # a secret's file's path is no secret
                flag = max(action.option_strings, key=len)
                found.append((path, flag, "url" in action.dest))
    return found


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as e:
        code = int(e.code or 0)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_the_secret_flags_are_found() -> None:
    flags = secret_flags()
    # every customer command takes --token and --api-url; more is welcome, fewer is a broken walk
    assert {f for _, f, _ in flags} >= {"--token", "--api-url"}, flags
    assert len({p for p, _, _ in flags}) > 50, flags


def _usage_errors(path: tuple[str, ...], flag: str, value: str, every_form: bool) -> Iterator[list[str]]:
    """Usage errors with the secret in them: on every command the commonest ones, on a few every
    form (each costs a parser built from scratch)."""
    abbreviation = flag[:len(flag) - 1]
    yield [*path, flag, value, "--no-such-flag"]                 # unrecognized arguments
    yield [*path, f"{abbreviation}={value}", "--no-such-flag"]  # argparse's prefix matching
    yield [flag, value, *path, "--no-such-flag"]                 # a global flag before the command
    if not every_form:
        return
    yield [*path, f"{flag}={value}", "--no-such-flag"]
    yield [*path, abbreviation, value, "--no-such-flag"]
    yield [*path, "--no-such-flag", flag, value]
    yield [*path, flag, value, "extra", "positional", "args"]
    yield [flag, value, "no-such-command"]
    yield [*path, flag]                                           # expected one argument (and no secret)
    yield [*path[:1], "no-such-verb", flag, value]


@pytest.mark.parametrize("flag", ["--token", "--api-url"])
def test_every_secret_flag_through_a_usage_error_is_masked(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    drove = 0
    for n, (path, f, is_url) in enumerate(secret_flags()):
        if f != flag:
            continue
        value = f"https://me:{URL_PASSWORD}@z9.example.com/v1" if is_url else SECRET
        hidden = URL_PASSWORD if is_url else SECRET
        for argv in _usage_errors(path, f, value, every_form=n % 10 == 0 or path[-1:] == ("set",)):
            code, text = run(argv, capsys)
            assert code != 0, (argv, text)
            assert hidden not in text and hidden[:12] not in text, (argv, text)
            if value in argv and "usage:" in text:  # the command line is shown, the secret masked
                assert "command line: z9 " in text, (argv, text)
                assert "***" in text, (argv, text)
            drove += 1
    assert drove > 200, drove


def test_a_secret_given_to_a_command_without_that_flag_is_masked(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["api", "--token", SECRET], ["migrate", "--token", SECRET], ["dev", "--token", SECRET],
                 ["servers", "list", SECRET], ["context", "set", "x", "y", SECRET],
                 ["servers", "list", f"https://u:{URL_PASSWORD}@h/v1"]):
        code, text = run(argv, capsys)
        assert code != 0, (argv, text)
        assert SECRET not in text and URL_PASSWORD not in text, (argv, text)
        assert "command line: z9 " in text and "***" in text, (argv, text)


def test_a_global_flag_before_the_command_works(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """``z9 --token X servers list`` (as hcloud and kubectl take it) is the command with that flag."""
    seen = {}

    def fake_run(args: argparse.Namespace) -> int:
        seen.update(token=args.token, api_url=args.api_url, output=args.output, command=args.command)
        return 0

    monkeypatch.setattr("z9.client.cli.run", fake_run)
    assert main(["--token", SECRET, "--api-url=http://x/v1", "-o", "json", "servers", "list"]) == 0
    assert seen == {"token": SECRET, "api_url": "http://x/v1", "output": "json", "command": "servers"}
