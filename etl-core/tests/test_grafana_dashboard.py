"""docs/grafana/etl-dashboard.json: valid Grafana JSON whose queries use only series the pipeline exports.

The series are taken from a fresh ``PipelineMetrics`` registry and from the built-in destinations' own
metric holders, so renaming or removing a series fails here until the dashboard follows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from etl.metrics import PipelineMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "etl-dashboard.json"

PROMQL_FUNCTIONS = {
    "abs", "absent", "avg", "avg_over_time", "ceil", "changes", "clamp_max", "clamp_min", "count", "delta", "deriv",
    "floor", "histogram_quantile", "increase", "irate", "label_replace", "label_values", "max", "max_over_time", "min",
    "min_over_time", "quantile", "rate", "round", "scalar", "sort", "sort_desc", "sum", "time", "topk", "bottomk",
    "vector",
}  # fmt: skip
PROMQL_KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
}
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def exported(registry: CollectorRegistry) -> set[str]:
    """The sample names a registry exports, labelled series without children included."""
    return {family.name + suffix for family in registry.collect() for suffix in SUFFIXES.get(family.type, ("",))}


def engine_series() -> set[str]:
    return exported(PipelineMetrics().registry)


def destination_series() -> set[str]:
    ducklake = pytest.importorskip("etl_spark.ducklake.metrics")
    bigquery = pytest.importorskip("etl_spark.bigquery.metrics")
    return exported(ducklake.DuckLakeMetrics().registry) | exported(bigquery.BigQueryMetrics().registry)


def metric_names(expr: str) -> set[str]:
    """The series an expression reads: identifiers that are neither functions, keywords nor label names."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^{}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)  # label lists
    text = re.sub(r"\$\w+", "", text)  # Grafana variables
    text = re.sub(
        r"\blabel_values\((.*),\s*\w+\s*\)", r"label_values(\1)", text
    )  # Grafana: label_values(series, label)
    names = set()
    for match in re.finditer(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", text):
        name = match.group()
        called = text[match.end() :].lstrip().startswith("(")
        if called:
            assert name in PROMQL_FUNCTIONS, f"unknown PromQL function {name} in {expr}"
        elif name not in PROMQL_KEYWORDS:
            names.add(name)
    return names


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def queries(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if v["type"] == "query"]
    return exprs


def test_the_dashboard_is_grafana_json_with_a_prometheus_datasource_and_job_instance_variables() -> None:
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"]["uid"] == "${datasource}"
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len(panels) >= 10
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in board["panels"]:
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys() and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
    for panel in panels:
        assert panel["title"] and panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        targets = panel["targets"]
        assert targets, f"panel {panel['title']!r} has no query"
        assert len({t["refId"] for t in targets}) == len(targets), f"refIds repeat in {panel['title']!r}"
        for target in targets:
            assert target["datasource"]["uid"] == "${datasource}" and target["expr"].strip()
            # Every series is narrowed to the chosen pipelines.
            for selector in re.finditer(r"\betl_[a-z0-9_]+(\{[^}]*\})?", target["expr"]):
                assert 'job=~"$job"' in (selector.group(1) or "") and 'instance=~"$instance"' in selector.group(1), (
                    f"{selector.group()} in {panel['title']!r} is not filtered by $job and $instance"
                )


def test_every_engine_series_the_dashboard_reads_is_exported() -> None:
    used = {name for expr in queries(dashboard()) for name in metric_names(expr)}
    engine = {name for name in used if not name.startswith(("etl_ducklake_", "etl_bigquery_"))}
    assert engine, "the dashboard reads no engine series"
    assert engine <= engine_series(), f"not exported by the engine: {sorted(engine - engine_series())}"
    # The panels the issue asks for are all there.
    for series in (
        "etl_table_states",
        "etl_table_errors",
        "etl_replication_lag_bytes",
        "etl_slot_retained_wal_bytes",
        "etl_events_total",
        "etl_copied_rows_total",
        "etl_copy_table_rows_estimate",
        "etl_batch_write_seconds_bucket",
        "etl_commit_to_durable_seconds_bucket",
        "etl_reconnects_total",
        "etl_errors_total",
        "etl_batch_rows_bucket",
    ):
        assert series in used, f"no panel reads {series}"


def test_every_destination_series_the_dashboard_reads_is_exported() -> None:
    used = {name for expr in queries(dashboard()) for name in metric_names(expr)}
    destinations = {name for name in used if name.startswith(("etl_ducklake_", "etl_bigquery_"))}
    known = destination_series()
    assert destinations <= known, f"not exported by a built-in destination: {sorted(destinations - known)}"


def test_metric_names_are_parsed_from_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (destination, le) (rate(etl_batch_write_seconds_bucket{job=~"$job"}'
        '[$__rate_interval]))) / on (job) group_left () up{job="x"} > bool 0 unless absent(etl_typo)'
    )
    assert metric_names(expr) == {"etl_batch_write_seconds_bucket", "up", "etl_typo"}
    assert metric_names('label_values(etl_table_states{job=~"$job"}, instance)') == {"etl_table_states"}
