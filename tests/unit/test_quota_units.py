"""Every list of quota units is derived from the type registry: a type that declares a unit (and
counts toward it, or toward another type's) appears in ``GET /v1/quota``'s shape, ``z9 quota``'s
flags, the ``Z9_QUOTA_<UNIT>`` settings and their document without any other file naming it."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from z9 import resources
from z9.common.settings import Settings
from z9.resources import Immediate, QuotaUnit, QuotaUsage, ResourceType

# what the API, `z9 quota` and the documents promised before the units came from the registry
PROMISED = ["servers", "cores", "memory_mib", "addresses", "load_balancers", "volume_gib"]
LIFECYCLE = ("creating", "deleting", "destroying", "deleted", "failed")


@dataclass(frozen=True)
class Widget:
    id: str
    tenant_id: str
    region: str
    status: str
    status_before_delete: str | None = None

    @classmethod
    def from_record(cls, r: Any) -> "Widget":
        return cls(**r)

    def public(self) -> dict[str, Any]:
        return {"id": self.id}


def _widget(**kw: Any) -> ResourceType[Widget]:
    return ResourceType(**{"name": "widget", "prefix": "wdg", "table": "widgets", "model": Widget,
                           "kinds": ("WidgetDelete",), "deletion": Immediate("WidgetDelete"), "statuses": LIFECYCLE,
                           **kw})


@pytest.fixture
def widgets() -> Iterator[ResourceType[Widget]]:
    rtype = resources.register(_widget(
        quotas=(QuotaUnit("widget_gib", "GiB of widgets"),),
        quota_usage=QuotaUsage("widget_quota_usage", {"widget_gib": "widgets' sizes (GiB)",
                                                      "cores": "widgets' cores"})))
    try:
        yield rtype
    finally:
        resources.REGISTRY.pop("widget", None)


def test_the_units_are_the_slices_own_in_the_registrys_order() -> None:
    assert list(resources.quota_units()) == PROMISED
    assert [t.name for t, _ in resources.quota_counted_by("cores")] == ["server", "cluster"]  # they add up
    assert resources.quota_units()["memory_mib"].unit == "MiB of memory"


def test_a_new_types_unit_reaches_every_list(widgets: ResourceType[Widget]) -> None:
    from z9.api import quotas
    from z9.cli import build_parser

    assert list(resources.quota_units()) == [*PROMISED, "widget_gib"]
    assert "widgets' cores" in resources.quota_description("cores")  # a contribution to another's unit
    shape = quotas.tenant_quota_model().model_json_schema()
    assert list(shape["$defs"]["QuotaSet"]["properties"]) == [*PROMISED, "widget_gib"]
    args = build_parser().parse_args(["quota", "--tenant", "t", "--widget-gib", "5", "--cores", "default"])
    assert (args.widget_gib, args.cores) == (5, None)
    example = quotas.operation().example["quotas"]
    assert list(example) == [*PROMISED, "widget_gib"]
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("gen_settings", Path(__file__).parents[2] / "docs/gen_settings.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert "| `Z9_QUOTA_WIDGET_GIB` | int | unset | ≥ 0 |" in gen.render()


def test_the_registry_refuses_a_unit_declared_twice_or_counted_undeclared() -> None:
    with pytest.raises(ValueError, match="both declare the quota"):
        resources.register(_widget(quotas=(QuotaUnit("cores", "cores"),)))
    assert "widget" not in resources.REGISTRY
    with pytest.raises(ValueError, match="not a plain identifier"):
        _widget(quotas=(QuotaUnit("Bad-Unit", "x"),))
    resources.register(_widget(quota_usage=QuotaUsage("widget_quota_usage", {"gadgets": "widgets' gadgets"})))
    try:
        with pytest.raises(ValueError, match="counts toward quotas no type declares: \\['gadgets'\\]"):
            resources.quota_units()
    finally:
        resources.REGISTRY.pop("widget", None)


def test_defaults_come_from_z9_quota_unit_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("Z9_QUOTA_SERVERS", "3")
    monkeypatch.setenv("Z9_QUOTA_VOLUME_GIB", "0")
    assert Settings().quota_defaults == {"servers": 3, "volume_gib": 0}
    assert Settings(quota_defaults={"cores": 4}).quota_defaults == {"servers": 3, "volume_gib": 0, "cores": 4}
    monkeypatch.setenv("Z9_QUOTA_CORES", "-1")
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Settings()


def test_a_service_refuses_an_unknown_or_bad_quota_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo (Z9_QUOTA_SERVER) would leave the quota unlimited without a word: every command that
    reads the settings stops with the variable named, before it connects anywhere."""
    from z9.cli import quota_settings_problem, settings_error

    assert quota_settings_problem(Settings(quota_defaults={"servers": 1})) is None
    problem = quota_settings_problem(Settings(quota_defaults={"server": 1}))
    assert problem and problem.startswith("Z9_QUOTA_SERVER: no such quota (the quotas: Z9_QUOTA_SERVERS, "), problem
    monkeypatch.setenv("Z9_QUOTA_CORES", "many")
    with pytest.raises(ValueError) as e:
        Settings()
    assert settings_error(e.value).startswith("Z9_QUOTA_CORES: Input should be a valid integer"), settings_error(e.value)
    # and `z9` itself says so (one process: the wiring of main())
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    out = subprocess.run([sys.executable, "-m", "z9", "migrate"], env={**env, "Z9_QUOTA_SERVER": "3"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Z9_QUOTA_SERVER: no such quota" in out.stderr, out.stderr
