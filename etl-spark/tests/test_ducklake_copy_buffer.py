"""Copied rows gathered per table are written by the thread that handed them over."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow as pa

from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.ducklake.copy_buffer import CopyBuffers

ROWS = pa.table({"id": pa.array(range(100), pa.int32())})


def schema(table_id: int) -> TableSchema:
    return TableSchema(table_id, TableName("public", f"t{table_id}"), (ColumnSchema("id", 23),))


def ids(chunks: list[tuple[TableSchema, pa.Table]]) -> list[int]:
    return sorted(s.id for s, _ in chunks)


def on_another_thread(work: Callable[[], object]) -> None:
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()


def test_a_flush_takes_only_the_rows_its_own_thread_handed_over() -> None:
    # Otherwise the thread that copied a table could find its rows taken by another thread's flush,
    # return from its own flush at once and mark the copy finished while they were still being written.
    buffers = CopyBuffers(limit_bytes=1 << 30)
    buffers.add(schema(1), ROWS)
    on_another_thread(lambda: buffers.add(schema(2), ROWS))
    taken: list[tuple[TableSchema, pa.Table]] = []
    on_another_thread(lambda: taken.extend(buffers.take_own()))  # a third thread handed nothing over
    assert taken == []
    assert ids(buffers.take_own()) == [1]
    buffers.discard(2)  # a copy started again drops what its earlier attempt gathered
    assert buffers.take_own() == []


def test_a_full_chunk_is_returned_to_the_thread_that_filled_it() -> None:
    buffers = CopyBuffers(limit_bytes=ROWS.nbytes * 2)
    assert buffers.add(schema(1), ROWS) is None
    chunk = buffers.add(schema(1), ROWS)
    assert chunk is not None and chunk[1].num_rows == 200
    assert buffers.take_own() == []
