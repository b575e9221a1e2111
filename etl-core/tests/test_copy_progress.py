"""A copy's progress: counted by CopyTracker, recorded in the store where `etl status` reads it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from etl.metrics import PipelineMetrics
from etl.replication.progress import CopyTracker
from etl.store.base import CopyProgress, TableState, TableStateKind
from etl.store.memory import MemoryStore
from etl.store.snapshot import SnapshotStore

T = 16384


def test_the_tracker_records_the_start_the_rows_on_the_way_and_the_end() -> None:
    store = MemoryStore(1)
    metrics = PipelineMetrics()
    before = datetime.now(UTC)
    tracker = CopyTracker(
        "public.t", 1000, metrics, lambda p: store.record_copy_progress(T, p), interval=3600, record_interval=0
    )
    started = store.get_copy_progress(T)
    assert started is not None, "the start is recorded, so a status shows the copy at once"
    assert (started.rows, started.estimate, started.finished, started.fraction) == (0, 1000, False, 0.0)
    assert before <= started.started_at <= datetime.now(UTC) and started.started_at.tzinfo is not None

    tracker.advance(300)
    tracker.advance(200)
    middle = store.get_copy_progress(T)
    assert middle is not None and (middle.rows, middle.finished, middle.fraction) == (500, False, 0.5)
    assert middle.started_at == started.started_at and middle.recorded_at >= started.recorded_at

    tracker.advance(450)
    done = tracker.finish()
    assert store.get_copy_progress(T) == done
    assert (done.rows, done.finished, done.fraction, done.eta_seconds) == (950, True, 1.0, 0.0)
    assert metrics.registry.get_sample_value("etl_copied_rows_total", {"table": "public.t"}) == 950


def test_reports_wait_for_the_record_interval() -> None:
    reports: list[CopyProgress] = []
    tracker = CopyTracker("public.t", None, PipelineMetrics(), reports.append, record_interval=3600)
    for _ in range(10):
        tracker.advance(7)
    assert [p.rows for p in reports] == [0], "only the start until the interval passes"
    tracker.finish()
    assert [(p.rows, p.finished) for p in reports] == [(0, False), (70, True)]


def test_copy_progress_rate_share_and_time_left() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    half = CopyProgress(500, 1000, start, start + timedelta(seconds=10))
    assert (half.seconds, half.rate, half.fraction, half.eta_seconds) == (10.0, 50.0, 0.5, 10.0)
    ahead = CopyProgress(1500, 1000, start, start + timedelta(seconds=10))
    assert (ahead.fraction, ahead.eta_seconds) == (1.0, 0.0), "an estimate that lags behind the table is capped"
    unknown = CopyProgress(500, None, start, start + timedelta(seconds=10))
    assert (unknown.fraction, unknown.eta_seconds) == (None, None)
    just_started = CopyProgress(0, 1000, start, start)
    assert (just_started.rate, just_started.eta_seconds) == (0.0, None)
    finished = CopyProgress(900, 1000, start, start + timedelta(seconds=9), finished=True)
    assert (finished.fraction, finished.eta_seconds) == (1.0, 0.0)
    assert finished.age(start + timedelta(seconds=20)) == 11.0


class DocumentStore(SnapshotStore):
    """A SnapshotStore whose document is kept as the JSON text it would be written as."""

    name: ClassVar[str] = "document"

    def __init__(self, pipeline_id: int, document: str | None = None) -> None:
        super().__init__(pipeline_id)
        self.document = document
        if document is not None:
            self._restore_document(json.loads(document))

    def _save_document(self, document: dict[str, Any]) -> None:
        self.document = json.dumps(document)


def test_a_state_document_holds_copy_progress_and_older_documents_still_read() -> None:
    progress = CopyProgress(10, 20, datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, 0, 0, 2, tzinfo=UTC))
    store = DocumentStore(1)
    store.update_table_states({T: TableState(TableStateKind.DATA_SYNC)})
    store.record_copy_progress(T, progress)
    assert store.document is not None
    assert DocumentStore(1, store.document).get_copy_progress(T) == progress

    older = json.loads(store.document)
    del older["copy_progress"]  # written before copy progress existed
    reopened = DocumentStore(1, json.dumps(older))
    assert reopened.get_table_state(T) == TableState(TableStateKind.DATA_SYNC)
    assert reopened.get_copy_progress(T) is None


def test_settling_sets_the_exact_count_and_the_metric_only_grows() -> None:
    metrics = PipelineMetrics()
    tracker = CopyTracker("public.t", None, metrics, lambda p: None)

    def counted() -> float | None:
        return metrics.registry.get_sample_value("etl_copied_rows_total", {"table": "public.t"})

    tracker.advance(600)  # estimated from the source while a destination copied: a retried task counted twice
    tracker.settle(500)
    assert (tracker.progress().rows, counted()) == (500, 600)
    tracker.settle(800)
    assert (tracker.progress().rows, counted()) == (800, 800)
