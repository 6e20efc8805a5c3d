#!/usr/bin/env python3
"""Write the z9 Grafana dashboard, deploy/grafana/dashboards/z9.json, from the panel list below.

    python deploy/grafana/gen_dashboard.py          # rewrite the JSON
    python deploy/grafana/gen_dashboard.py --check  # exit 1 when the committed JSON is out of date

The PromQL is easier to review here than in 1000 lines of JSON. Every query that reads a metric
with a ``region`` label filters it by the dashboard's ``$region`` variable (multi-value, "All" =
``.*``); rates use ``$__rate_interval``. Metrics: docs/metrics.md. Every expression is checked
against a live Prometheus by deploy/check_queries.py (and tests/integration/observability/test_ops.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "z9.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
R = 'region=~"$region"'
RI = "$__rate_interval"


def quantile(phi: float, metric: str, by: str, selector: str = R) -> str:
    """``histogram_quantile(phi, …)`` of histogram ``metric`` over ``$__rate_interval``, kept by ``by``."""
    return f"histogram_quantile({phi}, sum by (le, {by}) (rate({metric}_bucket{{{selector}}}[{RI}])))"


def error_ratio(metric: str, errors: str, by: str, selector: str) -> str:
    """Share of ``metric``'s rate matching ``errors``; 0 (not absent) when nothing failed."""
    sel = f"{selector}," if selector else ""
    total = f"sum by ({by}) (rate({metric}{{{selector}}}[{RI}]))" if by else f"sum(rate({metric}[{RI}]))"
    failed = (f"sum by ({by}) (rate({metric}{{{sel}{errors}}}[{RI}]))" if by
              else f"sum(rate({metric}{{{errors}}}[{RI}]))")
    return f"({failed} or {total} * 0) / {total}"


class Layout:
    """Places panels left to right on Grafana's 24-column grid, a new line when full."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = 0
        self.line_h = 0

    def _id(self) -> int:
        return len(self.panels) + 1

    def _newline(self) -> None:
        if self.x:
            self.x, self.y, self.line_h = 0, self.y + self.line_h, 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"id": self._id(), "type": "row", "title": title, "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def panel(self, title: str, targets: list[tuple[str, str]], *, unit: str = "short", w: int = 12, h: int = 8,
              kind: str = "timeseries", desc: str = "") -> None:
        """One panel; ``targets`` are ``(expr, legendFormat)`` pairs."""
        if self.x + w > 24:
            self._newline()
        options = ({"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]}}
                   if kind == "timeseries" else {"reduceOptions": {"calcs": ["lastNotNull"]}})
        self.panels.append({
            "id": self._id(), "type": kind, "title": title, "description": desc, "datasource": DS,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": options,
            "targets": [{"refId": chr(65 + i), "datasource": DS, "expr": expr, "legendFormat": legend}
                        for i, (expr, legend) in enumerate(targets)]})
        self.x += w
        self.line_h = max(self.line_h, h)
        if self.x >= 24:
            self._newline()


def panels() -> list[dict[str, Any]]:
    """Every row and panel of the dashboard, in order."""
    g = Layout()
    g.row("Jobs")
    # max over the scheduler replicas first (keeping kind: they all report the same figures),
    # then the sum over kinds.
    g.panel("Jobs by status",
            [(f"sum by (region, status) (max by (kind, region, status) (z9_jobs{{{R}}}))", "{{region}} {{status}}")],
            desc="Jobs in the table by status, all kinds (z9_jobs, from the scheduler; max over replicas, "
                 "then summed over kinds).")
    g.panel("Throughput by outcome",
            [(f"sum by (region, outcome) (rate(z9_job_attempts_total{{{R}}}[{RI}]))", "{{region}} {{outcome}}")],
            unit="ops", desc="Attempts that ended per second, by outcome (succeeded, retry, snoozed, failed, "
                             "lease_lost, handed_over).")
    g.panel("Retry and failure rates by kind", [
        (f'sum by (region, kind) (rate(z9_job_attempts_total{{{R},outcome="retry"}}[{RI}]))', "{{region}} {{kind}} retry"),
        (f'sum by (region, kind) (rate(z9_job_attempts_total{{{R},outcome="failed"}}[{RI}]))', "{{region}} {{kind}} failed"),
    ], unit="ops", desc="Attempts ending in a temporary error (retry) or a final failure, per second.")
    g.panel("Retries and failures by error class", [
        (f'sum by (region, error_class) (increase(z9_job_attempts_total{{{R},outcome=~"retry|failed"}}[{RI}]))',
         "{{region}} {{error_class}}")],
        desc="Attempts that ended in retry or failed per rate interval, by error class (temporary, permanent, "
             "guard, attempts_exhausted, lease_lost, internal).")

    g.row("Queue")
    g.panel("Queue wait (claim delay)", [
        (quantile(0.5, "z9_job_queue_wait_seconds", "region"), "{{region}} p50"),
        (quantile(0.95, "z9_job_queue_wait_seconds", "region"), "{{region}} p95"),
    ], unit="s", desc="From the moment a job became runnable to its claim.")
    g.panel("Oldest pending job age", [(f"max by (region) (z9_job_oldest_pending_age_seconds{{{R}}})", "{{region}}")],
            unit="s", desc="Age of the oldest runnable pending job; Z9QueueStalled fires above 300 s for 5 minutes.")

    g.row("Latency")
    g.panel("Job attempt duration by kind", [
        (quantile(phi, "z9_job_duration_seconds", "region, kind"), f"{{{{region}}}} {{{{kind}}}} p{int(phi * 100)}")
        for phi in (0.5, 0.95, 0.99)], unit="s", desc="One attempt, from claim to its recorded end.")
    g.panel("Phase duration", [
        (quantile(0.95, "z9_job_phase_duration_seconds", "region, phase"), "{{region}} {{phase}} p95"),
        (quantile(0.5, "z9_job_phase_duration_seconds", "region, phase"), "{{region}} {{phase}} p50"),
    ], unit="s", desc="observe, plan, apply, verify (apply includes waiting for Proxmox tasks).")

    g.row("Leases, deletion")
    g.panel("Lease reclaims", [(f"sum by (region, kind) (increase(z9_lease_reclaims_total{{{R}}}[{RI}]))",
                                "{{region}} {{kind}}")], w=8,
            desc="Running jobs whose lease expired (worker died or stalled) and were taken back.")
    g.panel("Deletion-guard refusals (24 h)",
            [(f"sum by (region) (increase(z9_deletion_guard_refusals_total{{{R}}}[24h]))", "{{region}}")],
            w=8, kind="stat", desc="Any refusal pages (Z9DeletionGuardRefusal): a row pointed at a platform VM.")
    g.panel("Deletion buffers expired, retries promoted", [
        (f"sum by (region) (increase(z9_deletion_buffer_expiries_total{{{R}}}[{RI}]))", "{{region}} buffer expiries"),
        (f"sum by (region) (increase(z9_job_promotions_total{{{R}}}[{RI}]))", "{{region}} retry → pending"),
    ], w=8)

    g.row("Proxmox")
    g.panel("Proxmox error ratio",
            [(error_ratio("z9_proxmox_requests_total", 'status=~"5..|error"', "region", R), "{{region}}")],
            unit="percentunit", w=8, desc="Share of Proxmox API calls answered 5xx or not at all.")
    g.panel("Proxmox requests by endpoint and status", [
        (f"sum by (region, method, endpoint, status) (rate(z9_proxmox_requests_total{{{R}}}[{RI}]))",
         "{{region}} {{method}} {{endpoint}} {{status}}")], unit="reqps", w=16)
    g.panel("Proxmox request latency p95", [
        (quantile(0.95, "z9_proxmox_request_duration_seconds", "region, method, endpoint"),
         "{{region}} {{method}} {{endpoint}}")], unit="s")
    g.panel("Proxmox task wait p95", [
        (quantile(0.95, "z9_proxmox_task_wait_seconds", "region, task_type"), "{{region}} {{task_type}}")],
        unit="s", desc="Waiting for a Proxmox task (UPID) to end, by task type.")

    g.row("Executors")
    # Only executors export the unlabelled LISTEN metrics (registered by init_executor): keep
    # the executors serving the selected regions.
    executors = f"on (instance) group by (instance) (z9_executor_jobs_in_flight{{{R}}})"
    g.panel("Executor jobs in flight", [(f"sum by (region) (z9_executor_jobs_in_flight{{{R}}})", "{{region}}")], w=8)
    g.panel("Executor LISTEN healthy", [(f"min by (instance) (z9_executor_listen_healthy and {executors})",
                                         "{{instance}}")], w=8,
            desc="1 while the executor's LISTEN connection is up.")
    g.panel("LISTEN reconnects", [
        (f"sum by (instance) (increase(z9_executor_listen_reconnects_total[{RI}]) and {executors})", "{{instance}}")],
        w=8)

    g.row("API")
    g.panel("API request rate by route and status", [
        (f"sum by (method, route, status) (rate(z9_http_requests_total[{RI}]))", "{{method}} {{route}} {{status}}")],
        unit="reqps", w=8)
    g.panel("API latency p95 by route", [
        (f"histogram_quantile(0.95, sum by (le, method, route) (rate(z9_http_request_duration_seconds_bucket[{RI}])))",
         "{{method}} {{route}}")], unit="s", w=8)
    g.panel("API 5xx ratio", [(error_ratio("z9_http_requests_total", 'status=~"5.."', "", ""), "5xx")],
            unit="percentunit", w=8)

    g.row("Targets")
    g.panel("Scrape targets up", [("max by (job, service, instance) (up)", "{{service}} {{instance}}")], w=24, h=6)
    return g.panels


def dashboard() -> dict[str, Any]:
    """The dashboard JSON model (Grafana schemaVersion 39)."""
    return {
        "uid": "z9-overview", "title": "z9 jobs", "tags": ["z9"], "timezone": "utc", "schemaVersion": 39,
        "version": 1, "editable": True, "refresh": "30s", "time": {"from": "now-3h", "to": "now"},
        "description": "z9 job system: jobs, queue, latency, leases, Proxmox, executors, API (docs/metrics.md).",
        "annotations": {"list": []},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {"text": "Prometheus", "value": "z9-prometheus"}},
            {"name": "region", "label": "Region", "type": "query", "datasource": DS,
             "query": {"query": "label_values(z9_job_oldest_pending_age_seconds, region)", "refId": "region"},
             "definition": "label_values(z9_job_oldest_pending_age_seconds, region)",
             "multi": True, "includeAll": True, "allValue": ".*", "refresh": 2, "sort": 1,
             "current": {"text": ["All"], "value": ["$__all"]}},
        ]},
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Generate the z9 Grafana dashboard JSON.")
    p.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python deploy/grafana/gen_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
