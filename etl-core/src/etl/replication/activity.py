"""What the running pipeline wrote into each table, kept in the store for ``etl status`` in another process.

Every durable streamed batch adds its changes, per table and kind, to counts that begin when the pipeline
starts, and marks the time the batch became durable. The counts are recorded in the store at most every
``EVERY_S`` seconds (a store write per batch would cost a busy stream more than the batch) and when a writer
closes. One recorder serves every writer of the pipeline (the apply worker's and each table's catch-up).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

import structlog

from etl.errors import TransientError
from etl.replication.written_log import EVERY_S
from etl.schema import TableId
from etl.store.base import Store, TableActivity

log = structlog.get_logger(__name__)


class ActivityRecorder:
    def __init__(self, store: Store, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._every_s = every_s
        self._clock = clock
        self._since = datetime.now(UTC)
        self._lock = threading.Lock()
        """Guards the counts; held briefly, never across a store write (writers count while a record is written)."""
        self._recording = threading.Lock()
        self._activity: dict[TableId, TableActivity] = {}
        self._pending: set[TableId] = set()
        self._last_record = float("-inf")

    def written(self, counts: Mapping[TableId, Mapping[str, int]], at: datetime) -> None:
        """A batch is durable since ``at``: ``counts`` of its changes, per table and kind (``CHANGE_KINDS``' names)."""
        if not counts:  # a batch of schema changes or keepalive progress only: nothing to tell
            return
        with self._lock:
            for table_id, kinds in counts.items():
                was = self._activity.get(table_id) or TableActivity(0, 0, 0, 0, self._since, at)
                self._activity[table_id] = replace(
                    was,
                    inserts=was.inserts + kinds.get("insert", 0),
                    updates=was.updates + kinds.get("update", 0),
                    deletes=was.deletes + kinds.get("delete", 0),
                    truncates=was.truncates + kinds.get("truncate", 0),
                    last_write_at=max(was.last_write_at, at),
                )
                self._pending.add(table_id)
            due = self._clock() - self._last_record >= self._every_s
        if due:
            self.flush()

    def flush(self) -> None:
        """Record what changed since the last record, if anything. A store unreachable for a moment costs this
        record, not the stream: the next one carries the counts."""
        with self._recording:  # one record at a time: a later snapshot is never overwritten by an earlier one
            with self._lock:
                if not self._pending:
                    return
                pending = {table_id: self._activity[table_id] for table_id in self._pending}
                self._pending.clear()
                self._last_record = self._clock()
            try:
                self._store.record_table_activity(pending)
            except TransientError as exc:
                with self._lock:
                    self._pending.update(pending)
                log.warning("could not record the tables' activity; the stream goes on", error=exc.message)
