"""Hands batches to the destination with one write in flight, and records durable progress."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime

import structlog

from etl.destination.base import Destination, Paced, WriteResult
from etl.errors import DestinationError, TableError, TableErrors, TransientError, may_pass
from etl.events import EventBatch, summed_counts
from etl.lsn import Lsn
from etl.metrics import PipelineMetrics
from etl.replication.activity import ActivityRecorder
from etl.replication.backoff import backoff_delays
from etl.replication.written_log import WrittenLog
from etl.store.base import Store

log = structlog.get_logger(__name__)

RETRIES = 8


class BatchWriter:
    """One destination write in flight at a time, off the reading thread.

    ``submit`` returns as soon as the previous write is done and the new one started, so the next
    batch fills while this one is written. Progress is stored, and reported through ``durable_lsn``,
    only after the destination says the write is durable (after ``flush`` for accepted writes).
    Destination failures that may pass are retried with backoff (a ``DestinationError`` that says it is not
    ``transient`` fails the write at once); a ``TableError`` naming a table, or each of a ``TableErrors``, is
    handed to ``on_table_error`` and the batch is retried without those tables.
    """

    def __init__(
        self,
        destination: Destination,
        store: Store,
        worker: str,
        on_table_error: Callable[[int, TableError], None],
        durable_lsn: Lsn = Lsn.ZERO,
        *,
        metrics: PipelineMetrics | None = None,
        activity: ActivityRecorder | None = None,
    ) -> None:
        self._destination = destination
        self._destination_name = str(getattr(destination, "name", type(destination).__name__))
        self._metrics = metrics
        self._activity = activity
        self._store = store
        self._worker = worker
        self._on_table_error = on_table_error
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"write-{worker}")
        self._in_flight: Future[None] | None = None
        self._lock = threading.Lock()
        self.durable_lsn = durable_lsn
        self.write_started: float | None = None
        """When the write in flight began (``time.monotonic``), retries included; ``None`` between writes."""
        self.min_interval_s = float(destination.min_write_interval_s) if isinstance(destination, Paced) else 0.0
        self._submitted = float("-inf")
        self._written_log = WrittenLog(worker)

    @property
    def busy(self) -> bool:
        return self._in_flight is not None and not self._in_flight.done()

    def submit(self, batch: EventBatch) -> None:
        self.wait()
        self._submitted = time.monotonic()
        self._in_flight = self._executor.submit(self._write, batch)

    def in_flight(self) -> Future[None] | None:
        """The write in flight, if any, which another thread may wait for (``Future.result``)."""
        return self._in_flight

    def next_write_in(self) -> float:
        """Seconds until the destination's ``min_write_interval_s`` since the last write began has passed."""
        return self._submitted + self.min_interval_s - time.monotonic()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the write in flight; re-raise its failure. False when ``timeout`` passed first."""
        future = self._in_flight
        if future is None:
            return True
        try:
            future.result(timeout)
        except TimeoutError:
            return False
        self._in_flight = None
        return True

    def check(self) -> None:
        """Re-raise the failure of a finished write now: a reader with nothing more to submit would
        otherwise hear of it only at shutdown."""
        future = self._in_flight
        if future is not None and future.done():
            self.wait()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._written_log.flush()
        if self._activity is not None:
            self._activity.flush()

    def _write(self, batch: EventBatch) -> None:
        self.write_started = time.monotonic()
        try:
            self._write_durably(batch)
        finally:
            self.write_started = None

    def _write_durably(self, batch: EventBatch) -> None:
        delays = backoff_delays()
        failures = 0
        started = time.perf_counter()
        while True:  # ends: written, or a failure re-raised; each TableError takes one table out of the batch
            try:
                result = self._destination.write_events(batch)
                if result is WriteResult.ACCEPTED:
                    self._destination.flush()
                break
            except (TableError, TableErrors) as exc:
                errors = exc.errors if isinstance(exc, TableErrors) else (exc,)
                if any(e.table_id is None or e.table_id not in batch.changes for e in errors):
                    raise
                for error in errors:
                    assert error.table_id is not None
                    self._on_table_error(error.table_id, error)
                    batch = batch.without_table(error.table_id)
            except (TransientError, DestinationError, OSError) as exc:
                if self._metrics is not None:
                    self._metrics.errors.labels("destination").inc()
                failures += 1
                if failures > RETRIES or not may_pass(exc):
                    raise
                delay = next(delays)
                log.warning("destination write failed; retrying", worker=self._worker, error=str(exc), retry_in=delay)
                time.sleep(delay)
        if batch.last_commit_lsn > self.durable_lsn:
            self.durable_lsn = Lsn(self._store.upsert_progress(self._worker, batch.last_commit_lsn))
        seconds, now, by_table = time.perf_counter() - started, datetime.now(UTC), batch.change_counts_by_table()
        counts = summed_counts(by_table)
        if self._metrics is not None:
            self._metrics.batch_written(batch, counts, self._destination_name, seconds, now)
        if self._activity is not None:
            self._activity.written(by_table, now)
        self._written_log.written(counts, set(batch.changes), seconds, batch.last_commit_lsn)
