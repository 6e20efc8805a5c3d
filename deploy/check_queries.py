#!/usr/bin/env python3
"""Check every PromQL expression of the z9 dashboard and rule file against a live Prometheus.

Usage (with a z9 stack running and a Prometheus scraping it, e.g. ``z9 dev`` and
``prometheus --config.file=deploy/prometheus/dev.yml``)::

    python deploy/check_queries.py --prometheus http://127.0.0.1:9090 --region dev-1 --wait 60

Each expression is sent to ``/api/v1/query`` (an instant query at "now") and must (1) be accepted
by Prometheus and (2) return at least one series. Grafana's variables are substituted first:
``$region`` by ``--region``, ``$__rate_interval`` by ``--rate-interval``, ``$__interval`` by
``--interval``, ``$__range`` by ``--range``. A template variable ``label_values(metric, label)``
is checked as the query ``metric`` whose series must carry ``label``.

Alert expressions have the shape ``<query> <comparison> <number>`` (and may filter inside too,
e.g. ``/ (total >= 4)``). On a healthy stack those comparisons filter everything out, which is
the point of an alert and says nothing about whether the query is right; so the full expression
is only required to be accepted, while the expression with every comparison to a number removed
must return data (that shows the metric names, labels and aggregations match what the services
export). Absence alerts work the other way round: ``absent(x)`` (and ``absent_over_time(x[d])``)
returns nothing while ``x`` exists, so the checker replaces each by ``x``, which must return data
(the metric the alert watches for is really exported). Scrape-health alerts such as
``up{job="z9"} == 0`` need nothing special: without the comparison, ``up{job="z9"}`` must return
the z9 targets. Recording rules are checked as their expression and as their recorded name.

Exit status 0 when every check passes, 1 otherwise (each failure printed), 2 when Prometheus
does not answer at all. Needs Python ≥ 3.11 and
PyYAML; no other dependency, so an operator can run it from any checkout.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

DEPLOY = Path(__file__).resolve().parent
DEFAULT_DASHBOARD = DEPLOY / "grafana" / "dashboards" / "z9.json"
DEFAULT_RULES = DEPLOY / "prometheus" / "rules" / "z9.rules.yml"

_NUMBER = r"[-+]?(?:[0-9]*\.)?[0-9]+(?:e[-+]?[0-9]+)?"
# `<query> <op> [bool] <number>` at the end of an alert expression.
_THRESHOLD = re.compile(rf"^(?P<query>.*?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?:bool\s+)?(?P<number>{_NUMBER})\s*$",
                        re.DOTALL | re.IGNORECASE)
# `<op> [bool] <number>` anywhere, as a whole operand (followed by `)`, a set operator or the end).
_COMPARISON = re.compile(rf"\s*(?<![=!<>~])(?:>=|<=|==|!=|>|<)\s*(?:bool\s+)?{_NUMBER}(?=\s*(?:\)|$|and\b|or\b|unless\b))",
                         re.IGNORECASE)
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<metric>.+?)\s*,\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$",
                           re.DOTALL)


@dataclass
class Query:
    """One expression to check. ``source`` names where it comes from (panel title and refId, rule
    name); ``need_data`` says whether an empty answer is a failure; ``label`` (template variables
    only) is a label every returned series must carry."""

    source: str
    expr: str
    need_data: bool = True
    label: str | None = None


@dataclass
class Result:
    """The outcome of one :class:`Query`: ``error`` is None when it passed; ``series`` is how many
    series Prometheus returned (``-1`` when the query itself failed)."""

    query: Query
    series: int
    error: str | None = None
    sample: list[dict[str, Any]] = field(default_factory=list)
    #: every value returned is NaN (a ratio or quantile over a window with no observations): the
    #: query works, but nothing was measured in the window — run some jobs, or ``--strict`` fails it
    only_nan: bool = False


def split_threshold(expr: str) -> tuple[str, str] | None:
    """``(query, "op number")`` when ``expr`` ends in a comparison with a number at top level,
    else ``None``."""
    m = _THRESHOLD.match(expr.strip())
    if not m:
        return None
    query = m.group("query").strip()
    depth = 0
    for ch in query:  # the comparison must not sit inside parentheses
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return None
    if depth != 0:
        return None
    return query, expr.strip()[len(m.group("query")):].strip()


def strip_comparisons(expr: str) -> str:
    """``expr`` without its comparisons to numbers (``x > 0.25`` → ``x``, ``(t >= 4)`` → ``(t)``)."""
    return _COMPARISON.sub("", expr.strip()).strip()


_ABSENT = re.compile(r"\babsent(?P<over_time>_over_time)?\s*\(")


def unwrap_absent(expr: str) -> str:
    """``expr`` with every ``absent(x)`` replaced by ``x`` and every ``absent_over_time(x[d])``
    by ``x`` (what must exist for the absence alert to stay quiet)."""
    while m := _ABSENT.search(expr):
        depth = 0
        for end in range(m.end() - 1, len(expr)):
            depth += {"(": 1, ")": -1}.get(expr[end], 0)
            if depth == 0:
                break
        else:
            return expr  # unbalanced: leave it to Prometheus to reject
        inner = expr[m.end():end].strip()
        if m.group("over_time"):
            inner = re.sub(r"\[[^\]]*\]$", "", inner).strip()
        expr = expr[:m.start()] + inner + expr[end + 1:]
    return expr


def substitute(expr: str, variables: dict[str, str]) -> str:
    """Replace Grafana variables (``$name`` and ``${name}``, longest names first) in ``expr``."""
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", variables[name]).replace("$" + name, variables[name])
    return expr


def _panels(panels: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))  # collapsed rows nest their panels


def dashboard_queries(dashboard: dict[str, Any], variables: dict[str, str]) -> list[Query]:
    """Every target expression of every panel, and every query template variable."""
    out: list[Query] = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        q = var.get("query")
        text = q.get("query") if isinstance(q, dict) else q
        m = _LABEL_VALUES.match(text or "")
        if m:
            out.append(Query(f"variable {var['name']}", substitute(m.group("metric"), variables), label=m.group("label")))
        else:
            out.append(Query(f"variable {var['name']}", substitute(text, variables)))
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                out.append(Query(f"panel {panel.get('title')!r} {target.get('refId', '')}".rstrip(),
                                 substitute(target["expr"], variables)))
    return out


def rule_queries(rules: dict[str, Any]) -> list[Query]:
    """Recording rules (expression and recorded name) and alerts (full expression: accepted;
    without its comparisons to numbers and with ``absent(x)`` replaced by ``x``: returns data)."""
    out: list[Query] = []
    for group in rules.get("groups", []):
        for rule in group.get("rules", []):
            expr = rule["expr"].strip()
            if "record" in rule:
                out.append(Query(f"record {rule['record']}", expr))
                out.append(Query(f"record {rule['record']} (recorded series)", rule["record"]))
                continue
            name = rule["alert"]
            bare = unwrap_absent(strip_comparisons(expr))
            if bare == expr:
                out.append(Query(f"alert {name}", expr))
                continue
            # Firing or not depends on the stack's health: only ask Prometheus to accept it...
            out.append(Query(f"alert {name} (full expression)", expr, need_data=False))
            # ...and require data from what the thresholds apply to (or what must not be absent).
            out.append(Query(f"alert {name} (comparisons removed)", bare))
    return out


def instant_query(prometheus: str, expr: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The result list of ``GET <prometheus>/api/v1/query?query=expr``; raises ``RuntimeError``
    with Prometheus's error text when the query is rejected or the server does not answer."""
    url = prometheus.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:  # 400/422: bad query, with a JSON error body
        try:
            body = json.load(e)
        except ValueError:
            raise RuntimeError(f"HTTP {e.code} from Prometheus") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise RuntimeError(f"no answer from Prometheus at {prometheus}: {e}") from e
    if body.get("status") != "success":
        raise RuntimeError(f"{body.get('errorType')}: {body.get('error')}")
    data = body["data"]
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    return data["result"]


def check_one(prometheus: str, q: Query) -> Result:
    """Run one query and judge it (see the module docstring)."""
    try:
        result = instant_query(prometheus, q.expr)
    except RuntimeError as e:
        return Result(q, -1, str(e))
    if q.need_data and not result:
        return Result(q, 0, "no data")
    if q.label and any(q.label not in s["metric"] for s in result):
        return Result(q, len(result), f"series without label {q.label!r}", result[:3])
    only_nan = bool(result) and all(str(s["value"][1]).lower() == "nan" for s in result)
    return Result(q, len(result), None, result[:3], only_nan)


def check(prometheus: str, queries: list[Query], wait_s: float = 0.0, poll_s: float = 2.0) -> list[Result]:
    """Check every query; queries that fail are retried every ``poll_s`` seconds until ``wait_s``
    seconds have passed (a stack just started needs a few scrapes and rule evaluations).
    Returns one result per query, in order."""
    deadline = time.monotonic() + wait_s
    results = [check_one(prometheus, q) for q in queries]
    while any(r.error for r in results) and time.monotonic() < deadline:
        time.sleep(poll_s)
        results = [r if r.error is None else check_one(prometheus, r.query) for r in results]
    return results


def all_queries(dashboard_path: Path, rules_path: Path, variables: dict[str, str]) -> list[Query]:
    """The dashboard's and the rule file's queries, variables substituted."""
    dashboard = json.loads(dashboard_path.read_text())
    rules = yaml.safe_load(rules_path.read_text())
    return dashboard_queries(dashboard, variables) + rule_queries(rules)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    p.add_argument("--dashboard", type=Path, default=DEFAULT_DASHBOARD)
    p.add_argument("--rules", type=Path, default=DEFAULT_RULES)
    p.add_argument("--region", default="dev-1", help="value of the dashboard's $region")
    p.add_argument("--rate-interval", default="1m", help="value of $__rate_interval (at least 4 scrape intervals)")
    p.add_argument("--interval", default="15s", help="value of $__interval")
    p.add_argument("--range", default="1h", help="value of $__range")
    p.add_argument("--wait", type=float, default=0.0, help="retry failing queries for this many seconds")
    p.add_argument("-v", "--verbose", action="store_true", help="print passing queries too")
    p.add_argument("--strict", action="store_true",
                   help="also fail queries whose every value is NaN (nothing measured in the window)")
    args = p.parse_args(argv)
    variables = {"region": args.region, "__rate_interval": args.rate_interval, "__interval": args.interval,
                 "__range": args.range}
    queries = all_queries(args.dashboard, args.rules, variables)
    try:
        instant_query(args.prometheus, "vector(1)")
    except RuntimeError as e:
        print(f"check_queries: {e}", file=sys.stderr)
        return 2
    results = check(args.prometheus, queries, args.wait)
    for r in results:
        if args.strict and r.error is None and r.only_nan:
            r.error = "only NaN: nothing measured in the window"
    failed = [r for r in results if r.error]
    for r in results:
        if r.error or args.verbose or r.only_nan:
            tag = "FAIL" if r.error else ("nan " if r.only_nan else "ok  ")
            print(f"{tag} {r.query.source}: {r.error or f'{r.series} series'}\n"
                  f"     {' '.join(r.query.expr.split())}")
    print(f"{len(results) - len(failed)}/{len(results)} queries passed against {args.prometheus}")
    nan = [r for r in results if r.only_nan and not r.error]
    if nan:
        print(f"{len(nan)} of them returned only NaN (no observations in the window: run some jobs "
              f"and check again, or pass --strict)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
