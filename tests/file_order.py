"""The order test files are handed to the workers: longest first.

pytest-xdist's ``--dist loadfile`` hands out whole files as workers free up, by default in order of
their number of tests (most first), which sends the files of one or two long tests (the README
walkthrough, schemathesis, the type checker) out last: the run then ends on one worker while the
others idle (a 13-minute run spent its last 1½ minutes on the walkthrough alone). Handing the
longest files out first instead (LPT scheduling) ends the workers close together.

The lengths are the seconds each file took in a measured run, kept in ``durations.json`` beside
this file; a file not listed there is put first (its length unknown, it should not be the one left
running at the end). Order only: a stale list slows a run down, it never changes what runs.
Refresh after a run with ``--junitxml``::

    .venv/bin/pytest --junitxml=/tmp/run.xml && .venv/bin/python -m tests.file_order /tmp/run.xml
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Sequence

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def known_durations() -> dict[str, float]:
    """``{test file path (from the repository root): seconds}``; empty when the list is missing or
    not such a mapping, and an entry that is not a number is left out (order only: never an error)."""
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: float(v) for k, v in data.items()
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def longest_files_first(items: list[pytest.Item], durations: dict[str, float]) -> None:
    """Reorder ``items`` in place: whole files, longest first (unknown ones before all), each file's
    tests in their own order."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(by_file, key=lambda f: -durations.get(f, float("inf")))  # stable: ties keep collection order
    items[:] = [item for f in order for item in by_file[f]]


def durations_from_junit(path: Path) -> dict[str, float]:
    """Seconds per test file from a pytest ``--junitxml`` report (setup, call and teardown)."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(path).iter("testcase"):
        classname = case.get("classname") or ""
        parts = classname.split(".")
        # classname is the module path (plus a class name when the test is in one)
        for n in range(len(parts), 0, -1):
            candidate = "/".join(parts[:n]) + ".py"
            if (DURATIONS.parent.parent / candidate).is_file():
                seconds[candidate] += float(case.get("time") or 0)
                break
    return {k: round(v, 1) for k, v in sorted(seconds.items())}


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.file_order REPORT.xml  (a pytest --junitxml report)", file=sys.stderr)
        return 2
    seconds = durations_from_junit(Path(argv[0]))
    if not seconds:
        print(f"{argv[0]}: no test of this repository in it", file=sys.stderr)
        return 1
    DURATIONS.write_text(json.dumps(seconds, indent=0) + "\n")
    print(f"{DURATIONS}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
