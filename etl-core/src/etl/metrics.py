"""The Prometheus series of one pipeline, on a registry of its own.

The engine records into ``PipelineMetrics`` where the thing happens (a batch made durable, a table
copied, a reconnect); values that belong to the source (its WAL position, the WAL each slot holds)
are sampled on a timer by ``etl.observe.Sampler``. Nothing here runs per row: counts come from
Arrow columns once per batch. Per-table labels exist only for tables in the publication and are
removed when a table leaves it, so label cardinality stays bounded.

Destinations add their own series through ``register_metrics(registry)`` (see docs/plugins.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Final

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from etl.events import CHANGE_KINDS, EventBatch
from etl.schema import TableId
from etl.store.base import TableState, TableStateKind

"""Op codes of change tables -> the ``kind`` label of ``etl_events_total`` (``schema`` besides; a truncate counts
once per table it empties)."""

LATENCY_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
ROW_BUCKETS: Final = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)


class MetricsHolder:
    """Holds Prometheus series made on one registry: a private one that nobody scrapes until ``register`` makes
    them anew on another (the engine's, for a destination's series). So code that records never asks whether
    metrics are on. Subclasses make their series in ``create``."""

    registry: CollectorRegistry

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.register(registry if registry is not None else CollectorRegistry(auto_describe=True))

    def register(self, registry: CollectorRegistry) -> None:
        """Make the series on ``registry`` (from now on they are recorded there, starting at zero)."""
        self.registry = registry
        self.create(registry)

    def create(self, registry: CollectorRegistry) -> None:
        raise NotImplementedError


class PipelineMetrics(MetricsHolder):
    """Every ``etl_*`` series of one pipeline. ``registry`` is what ``/metrics`` serves."""

    def create(self, r: CollectorRegistry) -> None:
        self.copied_rows = Counter(
            "etl_copied_rows", "Rows copied by the initial copy, per table", ["table"], registry=r
        )
        self.copy_estimate = Gauge(
            "etl_copy_table_rows_estimate",
            "Rows of a table being copied, as the planner estimates",
            ["table"],
            registry=r,
        )
        self.backfills_failed = Counter(
            "etl_backfills_failed",
            "Backfills (etl resync --where) dropped after an error, the table streaming on",
            ["table"],
            registry=r,
        )
        self.events = Counter("etl_events", "Changes made durable in the destination, per kind", ["kind"], registry=r)
        self.batch_write_seconds = Histogram(
            "etl_batch_write_seconds",
            "Time to write one streamed batch durably",
            ["destination"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram("etl_batch_rows", "Rows per streamed batch", buckets=ROW_BUCKETS, registry=r)
        self.replication_lag_bytes = Gauge(
            "etl_replication_lag_bytes", "The source's WAL position minus the pipeline's durable position", registry=r
        )
        self.slot_retained_wal_bytes = Gauge(
            "etl_slot_retained_wal_bytes", "WAL the source keeps for each of the pipeline's slots", ["slot"], registry=r
        )
        self.commit_to_durable_seconds = BulkHistogram(
            "etl_commit_to_durable_seconds",
            "From a transaction's commit on the source to the moment its changes are durable (every transaction)",
            LATENCY_BUCKETS,
        )
        r.register(self.commit_to_durable_seconds)
        self.errors = Counter("etl_errors", "Errors, per kind", ["kind"], registry=r)
        self.reconnects = Counter(
            "etl_reconnects", "Reconnects of the apply worker after a lost connection", registry=r
        )
        for kind in (*CHANGE_KINDS.values(), "schema"):
            self.events.labels(kind)  # every kind is exported from the start, at 0
        self._states = _StatesCollector()
        r.register(self._states)

    def watch_states(self, states: Callable[[], Mapping[TableId, TableState]]) -> None:
        """Export ``etl_table_states`` and ``etl_table_errors`` from the live table states at each scrape."""
        self._states.source = states

    def batch_written(
        self, batch: EventBatch, counts: Mapping[str, int], destination: str, seconds: float, now: datetime
    ) -> None:
        """A streamed batch is durable: count its changes (``counts``, by kind), its size, its write time and its
        commit latency."""
        for kind, count in counts.items():
            if count:
                self.events.labels(kind).inc(count)
        rows = sum(counts.values())
        if batch.schema_changes:
            self.events.labels("schema").inc(batch.schema_changes)
        self.batch_rows.observe(rows)
        self.batch_write_seconds.labels(destination).observe(seconds)
        if batch.commit_times:
            durable = now.timestamp()
            committed = np.fromiter((t.timestamp() for t in batch.commit_times), np.float64, len(batch.commit_times))
            self.commit_to_durable_seconds.observe_many(np.maximum(durable - committed, 0.0))

    def forget_tables(self, names: Iterable[str]) -> None:
        """Drop the per-table series of tables that left the publication."""
        for name in names:
            for series in (self.copied_rows, self.copy_estimate):
                with contextlib.suppress(KeyError):  # never labelled: the table was not copied here
                    series.remove(name)


class BulkHistogram(Collector):
    """A histogram that takes many observations at once (every transaction of a batch) at numpy speed.

    ``prometheus_client``'s ``Histogram`` takes one value per call; a batch may commit 100,000 transactions.
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self._name, self._documentation = name, documentation
        self._bounds = np.asarray(buckets, np.float64)
        self._counts = np.zeros(len(buckets) + 1, np.int64)  # the last one: above every bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: npt.NDArray[np.float64]) -> None:
        # searchsorted(side="left"): a value equal to a bound falls in that bound's bucket (le is inclusive)
        counts = np.bincount(np.searchsorted(self._bounds, values, side="left"), minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum += float(values.sum())

    def collect(self) -> Iterable[HistogramMetricFamily]:
        with self._lock:
            cumulative = np.cumsum(self._counts).tolist()
            total = self._sum
        buckets = [(repr(bound), count) for bound, count in zip(self._bounds.tolist(), cumulative, strict=False)]
        buckets.append(("+Inf", cumulative[-1]))
        family = HistogramMetricFamily(self._name, self._documentation)
        family.add_metric([], buckets, total)
        yield family

    def describe(self) -> Iterable[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._documentation)


class _StatesCollector(Collector):
    """``etl_table_states{state}`` and ``etl_table_errors``, read from the live states when scraped."""

    def __init__(self) -> None:
        self.source: Callable[[], Mapping[TableId, TableState]] = dict

    def collect(self) -> Iterable[GaugeMetricFamily]:
        states = self.source()
        counts = dict.fromkeys((k.value for k in TableStateKind), 0)
        for state in states.values():
            counts[state.kind.value] += 1
        by_state = GaugeMetricFamily("etl_table_states", "Tables of the pipeline in each state", labels=["state"])
        for kind, count in counts.items():
            by_state.add_metric([kind], count)
        yield by_state
        yield GaugeMetricFamily(
            "etl_table_errors", "Tables in the errored state", value=counts[TableStateKind.ERRORED.value]
        )

    def describe(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily("etl_table_states", "Tables of the pipeline in each state", labels=["state"])
        yield GaugeMetricFamily("etl_table_errors", "Tables in the errored state")
