"""Copied rows gathered per table until a chunk is worth a Spark job.

The engine hands a table's copy over in Arrow batches of at most 64k rows. A Spark write costs
about 0.7 s whatever its size, so writing each batch on its own would spend the copy in fixed
costs; gathering them into chunks of ``limit_bytes`` makes one job (and one data file) per chunk.
Gathered rows are accepted, not durable, until written; the engine flushes at the end of every
table's copy, and a copy cut short is started again from scratch, so nothing is lost.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pyarrow as pa

from etl.schema import TableId, TableSchema


@dataclass
class _Pending:
    schema: TableSchema
    parts: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0

    def table(self) -> pa.Table:
        return pa.concat_tables(self.parts)


class CopyBuffers:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._pending: dict[TableId, _Pending] = {}
        self._writing: dict[TableId, threading.Lock] = {}

    def add(self, schema: TableSchema, rows: pa.Table) -> tuple[TableSchema, pa.Table] | None:
        """Gather ``rows``; when the table's rows reach the limit, take them all out and return them."""
        with self._lock:
            pending = self._pending.get(schema.id)
            if pending is None or pending.schema != schema:
                pending = self._pending[schema.id] = _Pending(schema)
            pending.parts.append(rows)
            pending.nbytes += rows.nbytes
            if pending.nbytes < self.limit_bytes:
                return None
            del self._pending[schema.id]
        return pending.schema, pending.table()

    def take_all(self) -> list[tuple[TableSchema, pa.Table]]:
        """Every table's gathered rows (also a table that got only an empty batch), out of the buffers."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        return [(p.schema, p.table()) for p in pending]

    def discard(self, table_id: TableId) -> None:
        with self._lock:
            self._pending.pop(table_id, None)

    @contextmanager
    def writing(self, table_id: TableId) -> Iterator[None]:
        """One chunk of a table is written at a time (a flush from another thread may write this table's rows)."""
        with self._lock:
            lock = self._writing.setdefault(table_id, threading.Lock())
        with lock:
            yield
