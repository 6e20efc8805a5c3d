"""Operations: the compose stack, the Prometheus rules and their promtool tests, the Grafana
provisioning and dashboard, and every PromQL expression checked against a real Prometheus
scraping a running z9 stack (deploy/check_queries.py).

Tests needing ``promtool``/``prometheus`` (Debian package ``prometheus``) skip when the binaries
are missing, unless ``Z9_REQUIRE_PROMETHEUS=1`` (set by ``.ci/run``), which makes that a failure.
"""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
import yaml

from tests.support import REGION, SimAdmin, free_port, make_tenant, wait_until
from z9.dev import _terminate, write_prometheus_targets

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules" / "z9.rules.yml"
RULE_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "z9.json"
GRAFANA_ALERTS = DEPLOY / "grafana" / "provisioning" / "alerting" / "z9-alerts.yml"
COMPOSE = ROOT / "compose.yaml"
ENV_EXAMPLE = ROOT / ".env.example"
Z9_ENV_EXAMPLE = ROOT / "z9.env.example"


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"z9_deploy_{name.replace('/', '_')}", DEPLOY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


check_queries = _load_script("check_queries")
gen_grafana_alerts = _load_script("gen_grafana_alerts")
gen_dashboard = _load_script("grafana/gen_dashboard")


def _binary(name: str) -> str:
    """Path of a Prometheus binary; skip (or fail under Z9_REQUIRE_PROMETHEUS=1) without it."""
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path:
        return path
    msg = f"{name} not installed (Debian package `prometheus`: apt-get install -y prometheus)"
    if os.environ.get("Z9_REQUIRE_PROMETHEUS") == "1":
        pytest.fail(msg + "; Z9_REQUIRE_PROMETHEUS=1 requires it")
    pytest.skip(msg)


def _rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def _alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in _rules()["groups"] for r in g["rules"] if "alert" in r}


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # PyYAML resolves the `<<` merge keys like compose


def _catalog() -> dict[str, set[str]]:
    """docs/metrics.md's table: metric name -> its labels."""
    out: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        m = re.match(r"^\| `(z9_[a-z0-9_]+)` \| (\w+) \|([^|]*)\|", line)
        if m:
            out[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(3)))
    return out


def _all_exprs() -> list[tuple[str, str]]:
    """(source, expression) of every dashboard target, template variable and rule, unsubstituted."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = [(f"panel {p['title']}", t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    out += [(f"variable {v['name']}", v["query"]["query"]) for v in dashboard["templating"]["list"]
            if v["type"] == "query"]
    out += [(r.get("alert") or r["record"], r["expr"]) for g in _rules()["groups"] for r in g["rules"]]
    return out


# --- compose ---------------------------------------------------------------------------------

def test_compose_validates_against_the_compose_specification() -> None:
    exe = Path(sys.executable).parent / "check-jsonschema"
    assert exe.exists(), "check-jsonschema comes with the [test] extra"
    out = subprocess.run([str(exe), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR:?message} with ``env``."""
    def sub(m: re.Match) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if name in env:
            return env[name]
        assert op == ":-", f"${{{name}}} is not set in .env.example"
        return arg
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\?)([^}]*))?\}", sub, text)


def _env_example(path: Path | None = None) -> dict[str, str]:
    env = {}
    for line in (path or ENV_EXAMPLE).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[key.strip()] = value
    return env


def test_compose_services_run_real_z9_commands() -> None:
    from z9.cli import build_parser

    env = _env_example()
    z9_services = {n: s for n, s in _compose()["services"].items() if s.get("image", "").startswith("z9")}
    assert {"migrate", "api", "scheduler", "executor-dev-1", "reaper", "sim"} <= set(z9_services)
    sim_help = subprocess.run([sys.executable, "-m", "z9", "sim", "--help"], capture_output=True, text=True)
    assert sim_help.returncode == 0, sim_help.stderr
    for name, svc in z9_services.items():
        argv = [_interpolate(a, env) for a in svc["command"]]
        if argv[0] == "sim":  # its own parser (`z9 sim --help`): every flag used must be one of its
            for flag in (a for a in argv[1:] if a.startswith("--")):
                assert re.search(rf"\s{re.escape(flag)}\b", sim_help.stdout), f"{name}: z9 sim has no {flag}"
            continue
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"service {name}: `z9 {' '.join(argv)}` is not a valid z9 command line")
        assert args.command == argv[0]


def test_compose_files_env_and_dockerfile_sources_exist() -> None:
    compose = _compose()
    for name, svc in compose["services"].items():
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0] if isinstance(vol, str) else vol.get("source", "")
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
            else:
                assert source in compose.get("volumes", {}), f"{name}: named volume {source} not declared"
        for env_file in svc.get("env_file", []):
            path = env_file if isinstance(env_file, str) else env_file["path"]
            assert (ROOT / (path + ".example")).exists() or (ROOT / path).exists(), f"{name}: no {path}.example"
        if "build" in svc:
            assert (ROOT / svc["build"] / "Dockerfile").exists()
    # Every ${VAR} of compose.yaml is documented in .env.example (or has a default).
    env = _env_example()
    _interpolate(COMPOSE.read_text(), env)
    # .env.example's z9 settings are valid settings (Z9_REGIONS parses, dev-1 is the simulator).
    from z9.common.settings import Settings

    z9_env = {k: v for k, v in {**env, **_env_example(Z9_ENV_EXAMPLE)}.items() if k.startswith("Z9_")}
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("Z9_")}
    try:
        os.environ.update(z9_env)
        settings = Settings()
    finally:
        for k in z9_env:
            os.environ.pop(k, None)
        os.environ.update(saved)
    assert settings.regions["dev-1"].url == "https://sim:8006"
    # the executor reads dev-1's token secret from the compose secret the simulator reads too
    assert str(settings.regions["dev-1"].token_secret_file) == "/run/secrets/sim_token_secret"
    assert settings.regions["dev-1"].token_secret is None  # not in the settings every service reads
    assert not [v for k, v in _env_example(Z9_ENV_EXAMPLE).items() if "change-me" in v]
    # The Dockerfile copies only what exists.
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                if not source.startswith("--"):
                    assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"


def test_compose_has_no_secrets_health_checks_restart_policies_and_ordered_startup() -> None:
    compose = _compose()
    text = COMPOSE.read_text().lower()
    for secret in set(_env_example().values()):
        if "change-me" in secret:
            assert secret.lower() not in text, "a secret of .env.example is written into compose.yaml"
    services = compose["services"]
    for name, svc in services.items():
        assert "restart" in svc, f"{name} has no restart policy"
        if name not in ("migrate", "jaeger"):
            assert "healthcheck" in svc, f"{name} has no health check"
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in services and cond["condition"] in (
                "service_healthy", "service_completed_successfully", "service_started"), (name, dep)
    assert services["migrate"]["restart"] == "no"
    for name in ("api", "scheduler", "executor-dev-1", "reaper"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert services[name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://jaeger:")
    assert services["executor-dev-1"]["depends_on"]["sim"]["condition"] == "service_healthy"
    # Prometheus scrapes every z9 service on the port compose gives it.
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for sc in prom["scrape_configs"] for c in sc["static_configs"] for t in c["targets"]}
    for name in ("scheduler", "executor-dev-1", "reaper"):
        assert f"{name}:{services[name]['environment']['Z9_METRICS_PORT']}" in targets
    assert f"api:{services['api']['environment']['Z9_METRICS_PORT']}" in targets
    assert "api:8080" not in targets  # the API's metrics are never on its tenants' port
    # each service only the secrets it uses (docs/settings.md): the region's token the executor, and the
    # api and the reaper, which read the region (a plan, the periodic drift check)
    assert set(services["api"]["secrets"]) == {"installation_key", "sim_token_secret"}
    assert set(services["executor-dev-1"]["secrets"]) == {"sim_token_secret", "installation_key"}
    assert set(services["reaper"]["secrets"]) == {"sim_token_secret"}
    for name in ("scheduler", "migrate"):
        assert not services[name].get("secrets"), name
    for name, svc in services.items():
        assert ".env" not in svc.get("env_file", []), f"{name} is handed .env (every secret) whole"


def test_dev_prometheus_config_reads_the_targets_file_z9_dev_writes(tmp_path: Path) -> None:
    from z9.dev import metrics_ports

    config = yaml.safe_load((DEPLOY / "prometheus" / "dev.yml").read_text())
    assert config["rule_files"] == ["rules/z9.rules.yml"]
    (job,) = config["scrape_configs"]
    (files,) = [sd["files"] for sd in job["file_sd_configs"]]
    # Prometheus resolves relative paths against the config file's folder.
    assert [(DEPLOY / "prometheus" / f).resolve() for f in files] == [ROOT / ".z9" / "prometheus-targets.json"]
    assert "prometheus-targets.json" in (ROOT / "z9" / "dev.py").read_text()
    write_prometheus_targets(tmp_path / "t.json", metrics_ports(8080, 9101))
    groups = json.loads((tmp_path / "t.json").read_text())
    assert {g["labels"]["service"] for g in groups} == {"api", "scheduler", "executor", "reaper"}
    assert all(len(g["targets"]) == 1 and g["targets"][0].startswith("127.0.0.1:") for g in groups)


def test_a_missing_prometheus_binary_skips_unless_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("Z9_REQUIRE_PROMETHEUS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y prometheus"):
        _binary("z9-no-such-binary")
    monkeypatch.setenv("Z9_REQUIRE_PROMETHEUS", "1")
    with pytest.raises(pytest.fail.Exception, match="Z9_REQUIRE_PROMETHEUS=1"):
        _binary("z9-no-such-binary")


# --- Prometheus rules ------------------------------------------------------------------------

def test_promtool_checks_the_rules_and_configs() -> None:
    promtool = _binary("promtool")
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    for cfg in ("prometheus.yml", "dev.yml"):
        out = subprocess.run([promtool, "check", "config", "--syntax-only", str(DEPLOY / "prometheus" / cfg)],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_rule_unit_tests_pass() -> None:
    promtool = _binary("promtool")
    assert RULE_TESTS
    out = subprocess.run([promtool, "test", "rules", *map(str, RULE_TESTS)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_has_firing_and_quiet_test_cases() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for t in case.get("alert_rule_test", []):
                (fires if t.get("exp_alerts") else quiet).add(t["alertname"])
    alerts = set(_alerts())
    assert alerts - fires == set(), "alerts without a firing test case"
    assert alerts - quiet == set(), "alerts without a not-firing test case"
    assert {"Z9DeletionGuardRefusal", "Z9QueueStalled", "Z9LeaseReclaimSpike", "Z9JobsFailed",
            "Z9JobRetryRateHigh"} <= alerts


def test_alerts_have_severity_annotations_and_a_threshold_the_checker_can_strip() -> None:
    for name, rule in _alerts().items():
        assert rule["labels"]["severity"] in ("page", "warning"), name
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name
        assert check_queries.split_threshold(rule["expr"]) or rule["expr"].startswith("absent"), (
            f"{name}: expression neither ends in `<op> <number>` nor is an absent()")
    guard = _alerts()["Z9DeletionGuardRefusal"]
    assert guard["labels"]["severity"] == "page" and "for" not in guard  # any refusal pages at once
    # Scrape-health alerts name a scrape job both Prometheus configurations define.
    jobs = [{sc["job_name"] for sc in yaml.safe_load((DEPLOY / "prometheus" / cfg).read_text())["scrape_configs"]}
            for cfg in ("prometheus.yml", "dev.yml")]
    for name, rule in _alerts().items():
        for job in re.findall(r'\bjob\s*=~?\s*"([^"]*)"', rule["expr"]):
            assert all(job in defined for defined in jobs), f"{name}: no scrape job {job!r}"
    assert _alerts()["Z9TargetDown"]["expr"].startswith('up{job="z9"}')


def test_queries_use_only_catalogued_metrics_and_labels_and_filter_by_region() -> None:
    catalog = _catalog()
    assert len(catalog) >= 15 and "region" in catalog["z9_jobs"] and catalog["z9_executor_listen_healthy"] == set()
    for source, expr in _all_exprs():
        names = set(re.findall(r"\b(z9_[a-z0-9_]+)", expr))
        for name in names:
            base = re.sub(r"_(bucket|sum|count)$", "", name) if name not in catalog else name
            assert base in catalog, f"{source}: {name} is not in docs/metrics.md"
            selectors = re.findall(rf"\b{name}\{{([^}}]*)\}}", expr)
            for sel in selectors:
                for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", sel):
                    assert label in catalog[base] | ({"le"} if name.endswith("_bucket") else set()), (
                        f"{source}: {name} has no label {label!r}")
            if source.startswith("panel") and "region" in catalog[base]:
                assert f'{name}{{region=~"$region"' in expr, f"{source}: {name} not filtered by $region"


_AGGREGATION = re.compile(r"\b(sum|max|min|avg|count|group|stddev|stdvar)\s*(?:(by|without)\s*\(([^)]*)\)\s*)?\(")
_SELECTOR = re.compile(r"^\s*(z9_[a-z0-9_]+)\s*(?:\{([^}]*)\})?\s*$")


def _scheduler_gauges() -> dict[str, set[str]]:
    """docs/metrics.md's gauges served by the scheduler (every replica reports the same figure)
    -> their labels."""
    out: dict[str, set[str]] = {}
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[2] == "gauge" and cells[4] == "scheduler":
            out[cells[1].strip("`")] = set(re.findall(r"`(\w+)`", cells[3]))
    return out


def replica_aggregation_errors(expr: str, gauges: dict[str, set[str]]) -> list[str]:
    """What is wrong with each aggregation applied directly to a scheduler gauge of ``gauges``
    (name -> labels) in ``expr``: replicas must be merged with ``max`` (or ``min``), never summed
    or averaged, and that ``max`` must keep every label of the gauge not pinned by an equality
    matcher (``max by (region, status) (z9_jobs)`` takes the largest kind, not the total; sum
    over the kinds afterwards)."""
    errors = []
    for m in _AGGREGATION.finditer(expr):
        op, mode, grouping = m.group(1), m.group(2), m.group(3)
        start, depth = m.end() - 1, 0
        for end in range(start, len(expr)):
            depth += {"(": 1, ")": -1}.get(expr[end], 0)
            if depth == 0:
                break
        sel = _SELECTOR.match(expr[start + 1:end])
        if not sel or sel.group(1) not in gauges:
            continue
        name = sel.group(1)
        if mode is None:  # `max (x) by (labels)`
            trailing = re.match(r"\s*(by|without)\s*\(([^)]*)\)", expr[end + 1:])
            mode, grouping = (trailing.group(1), trailing.group(2)) if trailing else ("by", "")
        pinned = set(re.findall(r"(\w+)\s*=(?![=~])", sel.group(2) or ""))
        needed = gauges[name] - pinned
        labels = {g.strip() for g in (grouping or "").split(",") if g.strip()}
        lost = needed & labels if mode == "without" else needed - labels
        if op not in ("max", "min"):
            errors.append(f"{op} over {name}: replicas report the same figure, merge them with max")
        elif lost:
            errors.append(f"{op} over {name} drops {sorted(lost)}: keep them in the max, then sum")
    return errors


def test_the_replica_aggregation_check_catches_max_over_part_of_the_labels() -> None:
    gauges = _scheduler_gauges()
    assert gauges == {"z9_jobs": {"kind", "region", "status"}, "z9_job_oldest_pending_age_seconds": {"region"},
                      "z9_tenant_jobs_pending": {"region", "tenant"},
                      "z9_tenant_oldest_pending_age_seconds": {"region", "tenant"}}
    bad = replica_aggregation_errors
    assert bad('max by (region, status) (z9_jobs{region=~"$region"})', gauges) == [
        "max over z9_jobs drops ['kind']: keep them in the max, then sum"]
    assert bad("max(z9_jobs) by (region)", gauges) and bad("max without (kind) (z9_jobs)", gauges)
    assert bad("sum by (region, kind, status) (z9_jobs)", gauges)
    assert bad("sum(z9_job_oldest_pending_age_seconds)", gauges)
    assert not bad('sum by (region, status) (max by (kind, region, status) (z9_jobs{region=~"$region"}))', gauges)
    assert not bad('max by (region, kind) (z9_jobs{status="retry"})', gauges)  # status pinned
    assert not bad("max without (instance, job) (z9_jobs)", gauges)
    assert not bad("sum by (region) (z9_executor_jobs_in_flight)", gauges)  # one series per executor


def test_scheduler_gauges_are_merged_over_replicas_with_max_keeping_their_labels() -> None:
    gauges = _scheduler_gauges()
    errors = [f"{source}: {e}" for source, expr in _all_exprs() for e in replica_aggregation_errors(expr, gauges)]
    assert not errors, "\n".join(errors)
    assert any("z9_jobs" in expr for _, expr in _all_exprs())


def test_comments_say_only_executors_export_the_listen_metrics() -> None:
    # docs/metrics.md: served by executors only (init_executor registers them); the comments
    # explaining the executor guard of the rule and the dashboard must not say otherwise.
    rows = [line for line in (ROOT / "docs" / "metrics.md").read_text().splitlines()
            if line.startswith("| `z9_executor_listen_")]
    assert len(rows) == 2 and all(row.split("|")[4].strip() == "executor" for row in rows), rows
    for path in (RULES, DEPLOY / "grafana" / "gen_dashboard.py"):
        text = " ".join(path.read_text().split()).lower()
        for claim in ("every z9 process exports", "0 outside executors"):
            assert claim not in text, f"{path.name} says {claim!r}"


# --- Grafana ---------------------------------------------------------------------------------

def test_grafana_alerts_are_generated_from_the_prometheus_rules() -> None:
    assert gen_grafana_alerts.main(["--check"]) == 0, "run python deploy/gen_grafana_alerts.py"
    grafana = yaml.safe_load(GRAFANA_ALERTS.read_text())
    assert grafana["apiVersion"] == 1
    rules = {r["title"]: r for g in grafana["groups"] for r in g["rules"]}
    alerts = _alerts()
    assert set(rules) == set(alerts)
    for name, prom in alerts.items():
        g = rules[name]
        query = next(d for d in g["data"] if d["refId"] == "A")
        assert query["model"]["expr"] == prom["expr"], name
        assert query["datasourceUid"] == "z9-prometheus"
        assert g["for"] == prom.get("for", "0s") and g["labels"] == prom["labels"]
        cond = next(d for d in g["data"] if d["refId"] == g["condition"])
        assert cond["datasourceUid"] == "__expr__" and "$A" in cond["model"]["expression"]
    ds = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert [d["uid"] for d in ds["datasources"]] == ["z9-prometheus"]


def test_dashboard_is_valid_and_every_panel_has_a_datasource_and_queries() -> None:
    assert gen_dashboard.main(["--check"]) == 0, "run python deploy/grafana/gen_dashboard.py"
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["region"]["type"] == "query" and variables["region"]["multi"]
    assert variables["datasource"]["query"] == "prometheus"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 15
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels:
        assert p["datasource"]["type"] == "prometheus", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["refId"], p["title"]
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    for metric in ("z9_jobs", "z9_job_attempts_total", "z9_job_queue_wait_seconds_bucket",
                   "z9_job_oldest_pending_age_seconds", "z9_job_duration_seconds_bucket",
                   "z9_job_phase_duration_seconds_bucket", "z9_lease_reclaims_total", "z9_proxmox_requests_total",
                   "z9_proxmox_request_duration_seconds_bucket", "z9_http_requests_total",
                   "z9_http_request_duration_seconds_bucket", "z9_executor_jobs_in_flight",
                   "z9_executor_listen_healthy"):
        assert metric in exprs, f"the dashboard shows nothing of {metric}"
    assert "histogram_quantile" in exprs
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "z9.yml").read_text())
    mounts = dict(v.split(":")[:2] for v in _compose()["services"]["grafana"]["volumes"] if v.startswith("."))
    assert mounts["./deploy/grafana/dashboards"] == provider["providers"][0]["options"]["path"]


# --- the query checker -----------------------------------------------------------------------

def test_checker_splits_thresholds_and_substitutes_variables() -> None:
    split = check_queries.split_threshold
    assert split("max by (region) (x) > 300") == ("max by (region) (x)", "> 300")
    assert split("(a / (b >= 4)) > 0.25") == ("(a / (b >= 4))", "> 0.25")
    assert split("min(x) < 1") == ("min(x)", "< 1")
    assert split("sum(x)") is None
    assert split("(x > 1)") is None  # the comparison inside parentheses is not the alert's
    strip = check_queries.strip_comparisons
    assert strip("(a / (b >= 4)) > 0.25") == "(a / (b))"
    assert strip('min(x{status!="5"}) < 1') == 'min(x{status!="5"})'
    assert strip("x > bool 1e3 or y == -2") == "x or y"
    assert strip("histogram_quantile(0.95, x) * 2") == "histogram_quantile(0.95, x) * 2"
    sub = check_queries.substitute('rate(m{region=~"$region"}[$__rate_interval]) ${region}',
                                   {"region": "dev-1", "__rate_interval": "1m"})
    assert sub == 'rate(m{region=~"dev-1"}[1m]) dev-1'
    queries = check_queries.all_queries(DASHBOARD, RULES, {"region": "dev-1", "__rate_interval": "1m",
                                                           "__interval": "15s", "__range": "1h"})
    assert not [q for q in queries if "$" in q.expr]
    region_var = next(q for q in queries if q.source == "variable region")
    assert region_var.expr == "z9_job_oldest_pending_age_seconds" and region_var.label == "region"
    alert_parts = [q for q in queries if q.source.startswith("alert Z9JobRetryRateHigh")]
    assert [q.need_data for q in alert_parts] == [False, True]
    assert ">" not in alert_parts[1].expr and "= 4" not in alert_parts[1].expr
    # absence alerts: the watched metric itself must return data; scrape health without `== 0`
    unwrap = check_queries.unwrap_absent
    assert unwrap("absent(z9_jobs)") == "z9_jobs"
    assert unwrap('absent(up{job="z9", service="scheduler"} == 1)') == 'up{job="z9", service="scheduler"} == 1'
    assert unwrap("absent_over_time(z9_jobs{status=~\"a|b\"}[5m]) or absent(sum(x))") == (
        'z9_jobs{status=~"a|b"} or sum(x)')
    assert unwrap("sum(x)") == "sum(x)"
    parts = {q.source: q for q in queries if "Absent" in q.source or "TargetDown" in q.source}
    assert parts["alert Z9SchedulerAbsent (comparisons removed)"].expr == "z9_job_oldest_pending_age_seconds"
    assert parts["alert Z9ExecutorAbsent (comparisons removed)"].expr == "z9_executor_jobs_in_flight"
    assert parts["alert Z9TargetDown (comparisons removed)"].expr == 'up{job="z9"}'
    assert not parts["alert Z9SchedulerAbsent (full expression)"].need_data


# --- every expression against a real Prometheus scraping a running stack ---------------------

async def _wait_listening(port: int, proc: subprocess.Popen, what: str, timeout_s: float = 30) -> None:
    import socket

    def listening() -> bool:
        assert proc.poll() is None, f"{what} exited with code {proc.returncode}"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0
    await wait_until(listening, timeout_s, f"{what} to listen on port {port}", interval_s=0.1)


async def _wait_terminal(http: aiohttp.ClientSession, base: str, job_id: str, timeout_s: float = 60) -> dict:
    async def terminal() -> dict | None:
        async with http.get(f"{base}/jobs/{job_id}") as r:
            job = await r.json()
        return job if job["status"] in ("succeeded", "failed") else None
    return await wait_until(terminal, timeout_s, f"job {job_id} terminal", interval_s=0.1)


async def test_every_dashboard_and_rule_query_returns_data_from_a_running_stack(
        tmp_path: Path, db_url: str, pool: Any, sim: SimAdmin) -> None:
    prometheus = _binary("prometheus")
    server = sim.server
    api_port, prom_port = free_port(), free_port()
    metrics_ports = {"scheduler": free_port(), "executor": free_port(), "reaper": free_port()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("Z9_", "OTEL_"))}
    env.update({
        "Z9_DATABASE_URL": db_url,
        # No image list: the API accepts any template name (a missing one is waited for in the executor).
        "Z9_REGIONS": json.dumps({REGION: {"url": server.url, "token_id": server.token_id,
                                           "token_secret": server.token_secret,
                                           "verify_ssl": str(server.cert_path), "images": []}}),
        "Z9_METRICS_HOST": "127.0.0.1", "Z9_LEASE_TTL_S": "5", "Z9_HEARTBEAT_S": "1", "Z9_POLL_INTERVAL_S": "1",
        "Z9_TASK_POLL_S": "0.05", "Z9_BACKOFF_BASE_S": "0.2", "Z9_BACKOFF_CAP_S": "1",
        "Z9_SCHEDULER_INTERVAL_S": "0.2", "Z9_REAPER_INTERVAL_S": "0.2", "Z9_DELETION_BUFFER_S": "1",
        "Z9_SNOOZE_S": "0.2", "Z9_SHUTDOWN_GRACE_S": "5", "Z9_UNCERTAIN_WINDOW_S": "1",
        "Z9_JOB_METRICS_INTERVAL_S": "0.5", "Z9_JOB_METRICS_FINISHED_INTERVAL_S": "0.5",
    })
    procs: list[subprocess.Popen] = []
    logs = tmp_path / "logs"
    logs.mkdir()

    def spawn(name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        out = open(logs / f"{name}.log", "w")
        proc = subprocess.Popen(argv, env={**env, **(extra_env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                cwd=tmp_path)
        procs.append(proc)
        return proc

    try:
        z9 = [sys.executable, "-m", "z9"]
        api_metrics_port = free_port()  # the API's /metrics: a listener of its own, not the tenants' port
        api = spawn("api", z9 + ["api", "--port", str(api_port)], {"Z9_METRICS_PORT": str(api_metrics_port)})
        services = {}
        for name, port in metrics_ports.items():
            extra = ["--region", REGION] if name == "executor" else []
            services[name] = spawn(name, z9 + [name] + extra, {"Z9_METRICS_PORT": str(port)})
        await _wait_listening(api_port, api, "the API")
        for (name, port), proc in zip(metrics_ports.items(), procs[1:]):
            await _wait_listening(port, proc, f"the {name}'s metrics endpoint")

        # The targets file `z9 dev` writes, and deploy/prometheus/dev.yml with 1 s intervals.
        targets = tmp_path / "prometheus-targets.json"
        await _wait_listening(api_metrics_port, api, "the API's metrics endpoint")
        write_prometheus_targets(targets, {"api": api_metrics_port, **metrics_ports})
        config = yaml.safe_load((DEPLOY / "prometheus" / "dev.yml").read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        config["rule_files"] = [str(RULES)]
        config["scrape_configs"][0]["file_sd_configs"][0].update(files=[str(targets)], refresh_interval="1s")
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        prom = spawn("prometheus", [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                    f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        prom_url = f"http://127.0.0.1:{prom_port}"
        await _wait_listening(prom_port, prom, "prometheus")

        def ready() -> bool:  # listening is not ready: queries answer 503 until the TSDB is open
            assert prom.poll() is None, "prometheus exited"
            try:
                with urllib.request.urlopen(f"{prom_url}/-/ready", timeout=2):
                    return True
            except OSError:
                return False
        await wait_until(ready, 30, "prometheus ready", interval_s=0.2)

        def all_up() -> bool:
            up = check_queries.instant_query(prom_url, 'sum(up{job="z9"})')
            return bool(up and float(up[0]["value"][1]) == 4)
        await wait_until(all_up, 30, "every z9 target up", interval_s=0.5)

        # Some jobs: a create that retries once (a 500 on the clone), a plain create, a create
        # whose disk is smaller than its image's (fails permanently: disks cannot shrink), and a
        # delete whose buffer expires (stop, then ServerDelete).
        _, token = await make_tenant(pool, "ops")
        base = f"http://127.0.0.1:{api_port}/v1"
        await sim.fault(method="POST", path=r"/clone$", action="error", status=500,
                        reason="simulated busy node", times=1)
        spec = {"region": REGION, "cores": 1, "memory_mib": 1024, "disk_gib": 4}
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
            created = []
            for name, disk in (("ops-1", 4), ("ops-2", 4), ("ops-3", 1)):
                async with http.post(f"{base}/servers", json=dict(spec, name=name, image="debian-12",
                                                                  disk_gib=disk)) as r:
                    assert r.status == 202, await r.text()
                    created.append(await r.json())
            jobs = [await _wait_terminal(http, base, c["job"]["id"]) for c in created]
            assert [j["status"] for j in jobs] == ["succeeded", "succeeded", "failed"], jobs
            assert max(j["attempt"] for j in jobs[:2]) >= 2, "the injected 500 caused no retry"
            async with http.delete(f"{base}/servers/{created[1]['server']['id']}") as r:
                assert r.status == 202, await r.text()
                stop_job = (await r.json())["job"]
            assert (await _wait_terminal(http, base, stop_job["id"]))["status"] == "succeeded"
            async def deleted() -> bool:
                async with http.get(f"{base}/servers/{created[1]['server']['id']}") as r:
                    return (await r.json())["server"]["status"] == "deleted"
            await wait_until(deleted, 60, "the deleted server `deleted`", interval_s=0.2)
            # The near-miss of the seeds: a stale row pointing at the region's agent VM (vmid 100,
            # tagged z9-role-agent). Stopping it is refused by the deletion guard.
            await pool.execute("UPDATE servers SET vmid = 100, node = 'pve1', power_state = 'running', "
                               "status = 'running' WHERE id = $1", created[2]["server"]["id"])
            async with http.delete(f"{base}/servers/{created[2]['server']['id']}") as r:
                assert r.status == 202, await r.text()
                guarded = (await r.json())["job"]
            job = await _wait_terminal(http, base, guarded["id"])
            assert job["status"] == "failed" and "z9-role-agent" in job["error"]["message"], job

        # The page fires at once (no `for:`) from the real metrics; the failed jobs' alert is
        # pending (for: 1m; firing on a slow machine); nothing else fires on this healthy stack.
        def fired() -> set | None:
            alerts = {(a["metric"]["alertname"], a["metric"]["alertstate"])
                      for a in check_queries.instant_query(prom_url, "ALERTS")}
            return alerts if ("Z9DeletionGuardRefusal", "firing") in alerts and {
                ("Z9JobsFailed", "pending"), ("Z9JobsFailed", "firing")} & alerts else None
        alerts = await wait_until(fired, 30, "the guard's and the failed jobs' alerts", interval_s=0.5)
        guard = check_queries.instant_query(prom_url, 'ALERTS{alertname="Z9DeletionGuardRefusal"}')
        assert [(a["metric"]["kind"], a["metric"]["region"], a["metric"]["severity"]) for a in guard] == [
            ("ServerStop", REGION, "page")]
        # Z9ProxmoxErrorRateHigh may be *pending* (for: 10m; never firing in this test): the guest agent's
        # "not running" answers are no longer counted, but on this young stack's few calls the injected
        # clone 500 and PVE's expected 500s ("does not exist" for a VM z9 just destroyed, read back by
        # verify) can still pass 10 % (seen in .ci/run; follow-up: count only unexpected answers).
        # A target's absence alerts may be pending — never firing — only when Prometheus did see that target
        # down: a scrape missed its 1 s timeout on a loaded machine (up was 0 once in the window).
        missed = {a["metric"].get("service") for a in check_queries.instant_query(
            prom_url, 'min_over_time(up{job="z9"}[10m]) == 0')}
        absent = {("Z9TargetDown", "pending")} if missed else set()
        if "executor" in missed:
            absent.add(("Z9ExecutorAbsent", "pending"))
        assert {name for name, state in alerts if (name, state) != ("Z9ProxmoxErrorRateHigh", "pending")
                and (name, state) not in absent} <= {
            "Z9DeletionGuardRefusal", "Z9JobsFailed", "Z9JobRetryRateHigh"}, (alerts, missed)

        # "Jobs by status" shows the total over kinds, as the job table counts it: several kinds
        # finished (ServerCreate, ServerStop, ServerDelete), so the largest kind would not do.
        panel = next(p for p in json.loads(DASHBOARD.read_text())["panels"] if p["title"] == "Jobs by status")
        jobs_by_status = check_queries.substitute(panel["targets"][0]["expr"], {"region": REGION})
        async def agree() -> tuple | None:
            rows = await pool.fetch("SELECT status::text, kind, count(*) AS n FROM jobs WHERE region = $1 "
                                    "GROUP BY 1, 2", REGION)
            truth = {s: float(sum(r["n"] for r in rows if r["status"] == s))
                     for s in ("pending", "running", "retry", "succeeded", "failed")}
            shown = {s["metric"]["status"]: float(s["value"][1]) for s in check_queries.instant_query(prom_url, jobs_by_status)
                     if s["metric"]["region"] == REGION}
            return (rows, truth) if shown == truth else None
        rows, truth = await wait_until(agree, 30, "the panel to show the job table's counts", interval_s=0.5)
        assert len({r["kind"] for r in rows if r["status"] == "succeeded"}) >= 2, rows
        assert truth["succeeded"] > max(r["n"] for r in rows if r["status"] == "succeeded"), rows

        variables = {"region": REGION, "__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
        queries = check_queries.all_queries(DASHBOARD, RULES, variables)
        results = await asyncio.to_thread(check_queries.check, prom_url, queries, 30.0, 1.0)
        failed = [f"{r.query.source}: {r.error}\n    {r.query.expr}" for r in results if r.error]
        assert not failed, "queries failing against a live Prometheus:\n" + "\n".join(failed)
        assert len(results) > 40
        # Jobs of every kind just ran, inside every rate window: each query measured something
        # (NaN everywhere would mean a ratio or quantile over no observations).
        nan = [f"{r.query.source}: {r.query.expr}" for r in results if r.only_nan]
        assert not nan, "queries measuring nothing after jobs ran:\n" + "\n".join(nan)
        # Only the executor exports the LISTEN health gauge (the rule's comment says so).
        listen = check_queries.instant_query(prom_url, "count by (service) (z9_executor_listen_healthy)")
        assert [s["metric"]["service"] for s in listen] == ["executor"], listen

        # The checker can fail: unknown metrics return no data, bad PromQL is an error.
        bad = check_queries.check(prom_url, [check_queries.Query("unknown", "z9_no_such_metric_total"),
                                             check_queries.Query("syntax", "sum by (region (z9_jobs)")])
        assert bad[0].error == "no data" and "parse" in bad[1].error

        # The presence alerts see a service die: the executor's target goes down and its
        # metrics go stale at once, so both alerts are pending (for: 3m / 5m) within seconds.
        executor = services["executor"]
        executor.terminate()
        executor.wait(timeout=30)
        def executor_alerts() -> set | None:
            pending = {(a["metric"]["alertname"], a["metric"].get("service"))
                       for a in check_queries.instant_query(prom_url, 'ALERTS{alertstate="pending"}')}
            return pending if {("Z9TargetDown", "executor"), ("Z9ExecutorAbsent", None)} <= pending else None
        pending = await wait_until(executor_alerts, 30, "the executor's absence alerts pending", interval_s=0.5)
        assert not {name for name, _ in pending} & {"Z9SchedulerAbsent"}, pending
    except BaseException:
        broke = True
        raise
    else:
        broke = False
    finally:
        _terminate(procs[::-1])
        for log in sorted(logs.glob("*.log")):  # every service's log when the test failed
            text = log.read_text()
            if broke or "Traceback" in text:
                print(f"--- {log.name}\n{text[-6000:]}")


def test_compose_passes_no_secret_on_a_command_line() -> None:
    """`ps` shows every process's arguments to every local user: secrets go by file or env."""
    compose = _compose()
    for name, svc in compose["services"].items():
        for arg in svc.get("command") or []:
            assert not re.search(r"\$\{[^}]*(SECRET|PASSWORD|TOKEN)", arg) and arg != "--token-secret", (name, arg)
    sim = compose["services"]["sim"]
    assert "--token-secret-file" in sim["command"] and sim["secrets"] == ["sim_token_secret"]
    assert compose["secrets"]["sim_token_secret"] == {"environment": "Z9_SIM_TOKEN_SECRET"}


def test_the_simulator_takes_its_secret_from_a_file_or_the_environment_and_prints_none(tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret-from-file\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("Z9_")}
    for extra, env_secret, expect in ((["--token-secret-file", str(secret_file)], None, "s3cret-from-file"),
                                      ([], "s3cret-from-env", "s3cret-from-env")):
        port = free_port()
        run_env = dict(env, **({"Z9_SIM_TOKEN_SECRET": env_secret} if env_secret else {}))
        proc = subprocess.Popen([sys.executable, "-m", "z9", "sim", "--port", str(port), "--cert-dir",
                                 str(tmp_path / "cert"), *extra], env=run_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            line = ""
            while "z9 sim: region=" not in line:
                line = proc.stdout.readline()
                assert line, "z9 sim exited"
            assert "z9 sim: region=dev-1" in line and expect not in line, line
            import requests

            r = requests.get(f"https://127.0.0.1:{port}/api2/json/version", verify=False, timeout=10,
                             headers={"Authorization": f"PVEAPIToken=root@pam!z9={expect}"})
            assert r.status_code == 200, r.text
            r = requests.get(f"https://127.0.0.1:{port}/api2/json/version", verify=False, timeout=10,
                             headers={"Authorization": "PVEAPIToken=root@pam!z9=wrong"})
            assert r.status_code == 401
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=20)
        assert expect not in out

