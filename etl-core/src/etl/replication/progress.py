"""Progress of one table's initial copy: rows, rate, share of the planner's estimate, time left.

The table sync worker calls ``advance`` once per copied batch; every ``interval`` seconds (and at the
end) the progress is logged and handed to ``report`` (the store records it, so ``etl status`` in
another process shows it). The metrics count every batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog

from etl.metrics import PipelineMetrics

log = structlog.get_logger(__name__)

REPORT_INTERVAL_S: Final = 10.0


@dataclass(frozen=True)
class CopyProgress:
    """Where a table's copy stands."""

    rows: int
    estimate: int | None
    """Rows the planner expects (``reltuples``); ``None`` when the table was never analyzed."""
    seconds: float
    """Since the copy began."""

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def fraction(self) -> float | None:
        """Share of the estimate copied (capped at 1: estimates lag behind the table)."""
        return min(1.0, self.rows / self.estimate) if self.estimate else None

    @property
    def eta_seconds(self) -> float | None:
        if not self.estimate or self.rate <= 0:
            return None
        return max(0.0, (self.estimate - self.rows) / self.rate)


class CopyTracker:
    """Counts a copy's rows into the metrics and reports its progress every ``interval`` seconds."""

    def __init__(
        self,
        table: str,
        estimate: int | None,
        metrics: PipelineMetrics,
        report: Callable[[CopyProgress], None],
        interval: float = REPORT_INTERVAL_S,
    ) -> None:
        self._table = table
        self._estimate = estimate
        self._report = report
        self._interval = interval
        self._rows = 0
        self._started = time.monotonic()
        self._next_report = self._started + interval
        self._counter = metrics.copied_rows.labels(table)
        if estimate is not None:
            metrics.copy_estimate.labels(table).set(estimate)

    def advance(self, rows: int) -> None:
        self._rows += rows
        self._counter.inc(rows)
        if time.monotonic() >= self._next_report:
            self._next_report = time.monotonic() + self._interval
            self._log(self.progress())

    def finish(self) -> CopyProgress:
        """The final progress, reported (the caller logs the copy's end)."""
        progress = self.progress()
        self._report(progress)
        return progress

    def progress(self) -> CopyProgress:
        return CopyProgress(self._rows, self._estimate, time.monotonic() - self._started)

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
        self._report(progress)
