"""The ``etl_ducklake_*`` Prometheus series of one DuckLake destination.

The engine hands its registry to ``DuckLakeDestination.register_metrics`` once at start; until then (and
for embedders and tests that never call it) the series live on a private registry nobody scrapes, so
the code that records them never checks whether metrics are on. The catalog and the file writer hold
this one object, so registering swaps their series in place.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from etl.api import LATENCY_BUCKETS, MetricsHolder

FILE_KINDS: Final = ("data", "delete")
"""The ``kind`` label of the file series: Parquet data files and positional delete files."""
COPIED_ON: Final = ("driver", "spark")
"""The ``on`` label of ``etl_ducklake_copies`` and ``etl_ducklake_chunks``: where a table's copy, or a chunk of an
incremental copy, read and wrote its rows."""
TRANSACTION_OUTCOMES: Final = ("whole", "split")
"""The ``outcome`` label of ``etl_ducklake_large_transactions``: one snapshot, or split at a schema change."""
MAINTENANCE_STEPS: Final = ("merge", "rewrite", "expire", "cleanup", "orphans")
"""The ``step`` label of the maintenance series (``[destination.maintenance]``)."""


class DuckLakeMetrics(MetricsHolder):
    """Commit time, files and bytes written, conflicts retried; on ``registry`` (a private one by default)."""

    def create(self, registry: CollectorRegistry) -> None:
        self.commit_seconds = Histogram(
            "etl_ducklake_commit_seconds",
            "Time of one successful catalog transaction (one DuckLake snapshot), delete files written in it included",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.copies = Counter(
            "etl_ducklake_copies",
            "Tables copied, by where their rows were read and written: on the driver (small tables) or by Spark",
            ["on"],
            registry=registry,
        )
        self.chunks = Counter(
            "etl_ducklake_chunks",
            "Chunks of incremental copies written, by where their rows were read and written: on the driver (small"
            " chunks) or by Spark",
            ["on"],
            registry=registry,
        )
        self.files_written = Counter(
            "etl_ducklake_files_written", "Parquet files written into the lake, per kind", ["kind"], registry=registry
        )
        self.bytes_written = Counter(
            "etl_ducklake_bytes_written",
            "Bytes of Parquet files written into the lake, per kind",
            ["kind"],
            registry=registry,
        )
        self.commit_conflicts = Counter(
            "etl_ducklake_commit_conflicts",
            "Commits retried because another writer committed first or changed what the batch was computed from",
            registry=registry,
        )
        self.inlined_rows = Counter(
            "etl_ducklake_inlined_rows",
            "Rows written into the catalog as inlined data instead of into files",
            registry=registry,
        )
        self.inline_flush_rows = Histogram(
            "etl_ducklake_inline_flush_rows",
            "Inlined rows (live and ended) one flush wrote to a data file",
            buckets=(10, 100, 1_000, 10_000, 100_000, 1_000_000),
            registry=registry,
        )
        self.large_transactions = Counter(
            "etl_ducklake_large_transactions",
            "Transactions larger than a batch committed, by outcome: in one snapshot, or split at a schema change",
            ["outcome"],
            registry=registry,
        )
        self.open_transaction_rows = Gauge(
            "etl_ducklake_open_transaction_rows",
            "Rows written into files for the parts of a transaction larger than a batch, not committed yet",
            registry=registry,
        )
        self.maintenance = Counter(
            "etl_ducklake_maintenance",
            "What maintenance did, per step: files merged and rewritten, snapshots expired, files deleted"
            " (scheduled ones by cleanup, unknown ones by orphans)",
            ["step"],
            registry=registry,
        )
        self.maintenance_seconds = Histogram(
            "etl_ducklake_maintenance_seconds",
            "Time of one maintenance step, batches waiting meanwhile",
            ["step"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        for step in MAINTENANCE_STEPS:
            self.maintenance.labels(step)
        for on in COPIED_ON:
            self.copies.labels(on)
        for outcome in TRANSACTION_OUTCOMES:
            self.large_transactions.labels(outcome)
        for kind in FILE_KINDS:  # exported from the start, at 0
            self.files_written.labels(kind)
            self.bytes_written.labels(kind)

    def file_written(self, kind: str, size_bytes: int) -> None:
        self.files_written.labels(kind).inc()
        self.bytes_written.labels(kind).inc(size_bytes)
