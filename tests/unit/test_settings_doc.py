"""docs/settings.md documents every ``Z9_`` setting of the model, and is what the generator
(``docs/gen_settings.py``) makes of the model now (issue 13 §5)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from z9.common.settings import RegionSettings, Settings

ROOT = Path(__file__).resolve().parents[2]


def _gen():
    spec = importlib.util.spec_from_file_location("gen_settings", ROOT / "docs" / "gen_settings.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_setting_is_in_the_table_with_its_default() -> None:
    text = (ROOT / "docs" / "settings.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(Z9_[A-Z0-9_]+)` \| [^|]*(?:\\\|[^|]*)*\| ([^|]*) \|",
                                                         text, re.M)}
    from z9 import resources

    for name, field in Settings.model_fields.items():
        prefix = (field.json_schema_extra or {}).get("env_per_key")
        if prefix:  # one variable per key (Z9_QUOTA_<UNIT>: a row per quota unit of the registry)
            for unit in resources.quota_units():
                assert f"{prefix}{unit.upper()}" in rows, (name, unit)
            continue
        var = f"Z9_{name.upper()}"
        assert var in rows, f"{var} is not in docs/settings.md: run .venv/bin/python docs/gen_settings.py"
        if isinstance(field.default, (int, float)) and not isinstance(field.default, bool):
            assert rows[var].strip("` ") == f"{field.default:g}", (var, rows[var])
    for name in RegionSettings.model_fields:
        assert f"| `{name}` |" in text, name


def test_the_table_is_generated_from_the_model() -> None:
    assert _gen().main(["--check"]) == 0, "docs/settings.md is stale: run .venv/bin/python docs/gen_settings.py"


def test_a_setting_without_a_description_stops_the_generator(monkeypatch) -> None:
    gen = _gen()
    monkeypatch.delitem(gen.DESCRIPTIONS, "lease_ttl_s")
    try:
        gen.render()
    except SystemExit as e:
        assert "Settings.lease_ttl_s has no description" in str(e)
    else:
        raise AssertionError("render() accepted a setting without a description")
