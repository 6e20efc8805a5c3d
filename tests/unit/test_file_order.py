"""tests/file_order.py: the test files handed to the workers longest first."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import file_order
from tests.file_order import durations_from_junit, known_durations, longest_files_first


def _items(*nodeids: str) -> list[Any]:
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_files_go_longest_first_unknown_before_all_and_each_keeps_its_own_order() -> None:
    items = _items("tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2", "tests/c.py::t1", "tests/d.py::t1",
                   "tests/b.py::t2")
    longest_files_first(items, {"tests/a.py": 5.0, "tests/b.py": 50.0, "tests/c.py": 5.0})
    assert [i.nodeid for i in items] == ["tests/d.py::t1", "tests/b.py::t1", "tests/b.py::t2", "tests/a.py::t1",
                                         "tests/a.py::t2", "tests/c.py::t1"]


def test_durations_are_summed_per_file_from_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text("""<testsuites><testsuite>
<testcase classname="tests.unit.test_file_order" name="a" time="1.25"/>
<testcase classname="tests.unit.test_file_order" name="b" time="2.0"/>
<testcase classname="tests.unit.test_file_order.SomeClass" name="c" time="0.5"/>
<testcase classname="tests.nowhere.test_gone" name="d" time="9"/>
</testsuite></testsuites>""")
    assert durations_from_junit(report) == {"tests/unit/test_file_order.py": 3.8}


@pytest.mark.parametrize("text, expected", [
    ('{"tests/a.py": 5, "tests/b.py": 2.5}', {"tests/a.py": 5.0, "tests/b.py": 2.5}),
    ('{"tests/a.py": null, "tests/b.py": "7", "tests/c.py": true, "tests/d.py": 1}', {"tests/d.py": 1.0}),
    ("[]", {}), ('"x"', {}), ("{not json", {}), (None, {}),
])
def test_a_missing_or_malformed_list_orders_nothing_and_fails_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      text: str | None, expected: dict[str, float]) -> None:
    path = tmp_path / "durations.json"
    if text is not None:
        path.write_text(text)
    monkeypatch.setattr(file_order, "DURATIONS", path)
    assert known_durations() == expected
