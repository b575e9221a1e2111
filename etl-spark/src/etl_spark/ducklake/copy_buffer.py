"""Copied rows gathered per table until a chunk is worth a Spark job.

The engine hands a table's copy over in Arrow batches of at most 64k rows. A Spark write costs
about 0.7 s whatever its size, so writing each batch on its own would spend the copy in fixed
costs; gathering them into chunks of ``limit_bytes`` makes one job (and one data file) per chunk.
Gathered rows are accepted, not durable, until written; a copy cut short is started again from
scratch, so nothing is lost.

Rows are written by the thread that handed them over: a full chunk at once, the rest when that
thread flushes (the engine flushes at the end of each table's copy, from the thread that copied it).
So when a flush returns, every row its thread handed over is durable. A flush that also wrote other
threads' rows would let their own flush return early, while their rows were still being written.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pyarrow as pa

from etl.schema import TableId, TableSchema


@dataclass
class _Pending:
    schema: TableSchema
    owner: threading.Thread
    """The thread that handed the rows over: it writes them (a thread object, unlike an ident, is never reused)."""
    parts: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0

    def table(self) -> pa.Table:
        return pa.concat_tables(self.parts)


class CopyBuffers:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._pending: dict[TableId, _Pending] = {}

    def add(self, schema: TableSchema, rows: pa.Table) -> tuple[TableSchema, pa.Table] | None:
        """Gather ``rows``; when the table's rows reach the limit, take them all out and return them."""
        me = threading.current_thread()
        with self._lock:
            pending = self._pending.get(schema.id)
            if pending is None or pending.schema != schema:
                pending = self._pending[schema.id] = _Pending(schema, me)
            pending.owner = me
            pending.parts.append(rows)
            pending.nbytes += rows.nbytes
            if pending.nbytes < self.limit_bytes:
                return None
            del self._pending[schema.id]
        return pending.schema, pending.table()

    def take_own(self) -> list[tuple[TableSchema, pa.Table]]:
        """The gathered rows (also of a table that got only an empty batch) this thread handed over."""
        me = threading.current_thread()
        with self._lock:
            mine = [p for p in self._pending.values() if p.owner is me]
            for pending in mine:
                del self._pending[pending.schema.id]
        return [(p.schema, p.table()) for p in mine]

    def discard(self, table_id: TableId) -> None:
        with self._lock:
            self._pending.pop(table_id, None)
