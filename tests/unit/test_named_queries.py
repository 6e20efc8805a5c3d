"""The named queries, one ``.sql`` file per table: every query is used by the code, every fragment
by a query, and no statement writes the job table's column list or the shared rules by hand."""
from __future__ import annotations

import re
from pathlib import Path

from z9.common.sql import _USE, files, fragments, queries

ROOT = Path(__file__).resolve().parents[2]
CODE = ("libs", "services", "resources", "z9", "simulator")


def _code_text() -> str:
    return "\n".join(f.read_text() for d in CODE for f in sorted((ROOT / d).rglob("*.py")) if ".venv" not in f.parts)


def test_every_named_query_is_used() -> None:
    """A query no code names is dead (or its caller was renamed away in a merge)."""
    code = _code_text()
    unused = [n for n in queries() if not re.search(rf"[\"']{n}[\"']", code)]
    assert not unused, f"named queries no code uses: {unused}"


def test_every_fragment_is_used_and_the_files_are_per_table() -> None:
    texts = "\n".join(f.read_text() for f in files())
    used = {m.group(1) for m in _USE.finditer(texts)}
    assert set(fragments()) <= used, set(fragments()) - used
    names = {f.name for f in files()}
    assert {"jobs.sql", "resources.sql", "api_tokens.sql", "queries.sql"} <= names, names
    assert not (ROOT / "libs/common/z9/common/queries.sql").exists()  # one file per table, not one for all


def test_shared_rules_are_written_once() -> None:
    """The job insert's column list, the lowest-free-IP slot and the status-from-allowed rule stand
    once, as fragments; the statements use them (a copy drifted once: an insert without a column)."""
    raw = "\n".join(f.read_text() for f in files())
    assert raw.count("INSERT INTO jobs (id,") == 0
    assert raw.count("INSERT INTO jobs ({{job_columns}})") >= 5
    assert raw.count("FROM address_pool_ips i JOIN address_pools p ON p.id = i.pool_id\nWHERE i.pool_id = <pool>") == 1
    assert raw.count("{{free_ip_slot(") == 3
    assert raw.count("status::text = ANY(<allowed>::text[])") == 2  # the fragments themselves
    assert not re.findall(r"CASE WHEN \$\d[^\n]* status(::text)? = ANY\(\$\d", raw)  # no copy of the rule
    for name, text in queries().items():
        assert "{{" not in text and "<pool>" not in text, name  # every fragment expanded


def test_each_slice_store_is_its_own_module() -> None:
    """``from z9.resources.<type> import store`` names the slice's store — not a ``store`` name the
    slice's ``__init__`` bound to the generic one (which Python returns instead of the submodule)."""
    import importlib

    from z9 import resources

    for t in resources.types():
        pkg = importlib.import_module(t.package)
        own = importlib.import_module(f"{t.package}.store")
        assert getattr(pkg, "store") is own, t.name
        assert own.__name__ == f"{t.package}.store"
