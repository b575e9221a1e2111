"""The ``etl_bigquery_*`` Prometheus series of one BigQuery destination.

The engine hands its registry to ``BigQueryDestination.register_metrics`` once at start; until then (and
for embedders and tests that never call it) the series live on a private registry nobody scrapes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from etl.api import LATENCY_BUCKETS, MetricsHolder


class BigQueryMetrics(MetricsHolder):
    """Load jobs per table, copied rows, bytes loaded, DML time; on ``registry`` (a private one by default)."""

    def create(self, registry: CollectorRegistry) -> None:
        self.load_jobs = Counter(
            "etl_bigquery_load_jobs",
            "Load jobs that filled a staging table, per source table (quota: table modifications per day)",
            ["table"],
            registry=registry,
        )
        self.copied_rows = Counter(
            "etl_bigquery_copied_rows",
            "Rows of table copies and incremental copies' chunks staged, by where they were read: by Spark's tasks"
            " (`spark`), or handed over by the engine to the driver (`driver`: the engine's own copy)",
            ["on"],
            registry=registry,
        )
        self.bytes_loaded = Counter(
            "etl_bigquery_bytes_loaded", "Bytes of staged Parquet read by successful load jobs", registry=registry
        )
        self.dml_seconds = Histogram(
            "etl_bigquery_dml_seconds",
            "Time of one query job moving staged rows into a target table (a copy's INSERT, a batch's transaction)",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
