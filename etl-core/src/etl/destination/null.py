"""The null destination: counts what arrives and keeps nothing.

For measuring the engine without a destination's cost (see ``bench/``) and for dry runs.
"""

from __future__ import annotations

import threading
from typing import ClassVar

import pyarrow as pa

from etl.destination.base import InProcessDestination, WriteResult
from etl.events import EventBatch
from etl.schema import TableSchema


class NullDestination(InProcessDestination):
    name: ClassVar[str] = "null"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.copied_rows = 0
        self.changed_rows = 0
        self.batches = 0

    def drop_table_for_copy(self, schema: TableSchema) -> None:
        pass

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        with self._lock:
            self.copied_rows += rows.num_rows
        return WriteResult.DURABLE

    def write_events(self, batch: EventBatch) -> WriteResult:
        with self._lock:
            self.changed_rows += batch.row_count()
            self.batches += 1
        return WriteResult.DURABLE
