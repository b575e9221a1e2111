"""Progress of one table's initial copy: rows, rate, share of the planner's estimate, time left.

The table sync worker calls ``advance`` once per copied batch (for a copy that the destination runs
itself, a watcher of the source calls it, and ``settle`` sets the exact count at the end). The progress
is handed to ``report`` (the store records it, so ``etl status`` in another process shows it) when the
copy starts, every ``record_interval`` seconds and at the end, and logged every ``interval`` seconds.
The metrics count every batch. ``CopyProgress`` itself lives in ``etl.store.base``: it is what the store records.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Final

import structlog

from etl.metrics import PipelineMetrics
from etl.store.base import CopyProgress

__all__ = ["RECORD_INTERVAL_S", "REPORT_INTERVAL_S", "CopyProgress", "CopyTracker"]

log = structlog.get_logger(__name__)

REPORT_INTERVAL_S: Final = 10.0
"""Seconds between two ``copying`` log lines of one table."""

RECORD_INTERVAL_S: Final = 2.0
"""Seconds between two reports to the store (``etl status --watch`` refreshes every 2 s by default)."""


class CopyTracker:
    """Counts a copy's rows into the metrics, reports its progress and logs it every ``interval`` seconds.

    Constructing it reports the start (no rows yet), so a status shows the copy, with its estimate, at once.
    """

    def __init__(
        self,
        table: str,
        estimate: int | None,
        metrics: PipelineMetrics,
        report: Callable[[CopyProgress], None],
        *,
        interval: float = REPORT_INTERVAL_S,
        record_interval: float = RECORD_INTERVAL_S,
    ) -> None:
        self._table = table
        self._estimate = estimate
        self._report = report
        self._interval = interval
        self._record_interval = record_interval
        self._rows = 0
        self._counted = 0
        """The rows the metric counted (more than ``_rows`` once an estimate was settled lower)."""
        self._started_at = datetime.now(UTC)
        self._started = time.monotonic()  # elapsed time is measured on the monotonic clock
        self._next_log = self._started + interval
        self._next_record = self._started + record_interval
        self._counter = metrics.copied_rows.labels(table)
        if estimate is not None:
            metrics.copy_estimate.labels(table).set(estimate)
        self._report(self.progress())

    def advance(self, rows: int) -> None:
        self._rows += rows
        self._counted += rows
        self._counter.inc(rows)
        now = time.monotonic()
        if now >= self._next_log:
            self._next_log = now + self._interval
            self._log(self.progress())
        if now >= self._next_record:
            self._next_record = now + self._record_interval
            self._report(self.progress())

    def settle(self, rows: int) -> None:
        """The copy's exact row count, once known, replaces what was counted so far (an estimate, for a copy
        that a destination ran itself: ``copy_watch``); the metric only grows."""
        if rows > self._counted:
            self._counter.inc(rows - self._counted)
            self._counted = rows
        self._rows = rows

    def finish(self) -> CopyProgress:
        """The final progress, reported (the caller logs the copy's end)."""
        progress = self.progress(finished=True)
        self._report(progress)
        return progress

    def progress(self, *, finished: bool = False) -> CopyProgress:
        elapsed = timedelta(seconds=time.monotonic() - self._started)
        return CopyProgress(self._rows, self._estimate, self._started_at, self._started_at + elapsed, finished)

    def _log(self, progress: CopyProgress) -> None:
        fraction, eta = progress.fraction, progress.eta_seconds
        log.info(
            "copying",
            table=self._table,
            rows=progress.rows,
            rows_per_s=round(progress.rate),
            percent=None if fraction is None else round(100 * fraction, 1),
            eta_s=None if eta is None else round(eta),
        )
