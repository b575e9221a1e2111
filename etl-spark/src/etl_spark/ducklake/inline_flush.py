"""Flushing a table's inlined rows into a data file, as DuckDB's ``ducklake_flush_inlined_data`` does.

Every row of the inlined data table goes into one data file, ended rows too, with two more columns:
``_ducklake_internal_row_id`` (the row's id) and ``_ducklake_internal_snapshot_id`` (the snapshot that
inserted it). The file's ``begin_snapshot`` is its first row's snapshot and ``partial_max`` its last.
The ended rows are deleted by a delete file that records the snapshot that ended each. So time travel
to any earlier snapshot reads what it read before, and the change feed stays whole. The catalog rows
go in the same snapshot (``inline_flush:<table id>``).

The rows are read from the catalog (``FlushRows``) and written where that costs least: up to
``driver_flush_max_rows`` of them on the driver, where reading 100,000 rows takes about half a second and a Spark
task about four (a flush runs between two batches, or inside one: the stream waits for it); more by one Spark
task, so they never pass through the driver, which reads only their ids and snapshots, for the delete file
and the commit's check that the rows are still as they were read.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from etl.api import DestinationError
from etl_spark.ducklake.catalog import (
    CommitConflict,
    Composed,
    InlinedFlush,
    LakeColumn,
    LakeTable,
    Placed,
    Transaction,
    inlined,
)
from etl_spark.ducklake.catalog.engine import engine_for
from etl_spark.ducklake.lake import Lake
from etl_spark.ducklake.parquet_files import ONE_FILE, ROW_ID, SNAPSHOT, own_stats
from etl_spark.ducklake.types import Form

log = structlog.get_logger(__name__)


def write_flush(lake: Lake, table: LakeTable, name: str, driver_rows: int) -> InlinedFlush | None:
    """Write the rows of inlined data table ``name`` to a data file (and a delete file for the ended ones), on the
    driver when they are at most ``driver_rows``; ``None`` when it holds none. ``CommitConflict`` when the read
    of their values found other rows than the driver's read of their ids."""
    rows = lake.catalog.inlined_rows([name], [], Form.FILE, live=False)  # ids and snapshots only
    if rows.num_rows == 0:
        return None
    ended = rows["end_snapshot"].is_valid()
    shape = (rows.num_rows, int(pc.sum(ended).as_py() or 0))
    last_row_id = rows["row_id"][-1].as_py()
    spec = lake.table_spec(table, [*table.columns, ROW_ID, SNAPSHOT], ONE_FILE)
    task = FlushRows(lake.catalog.task_url, name, tuple(table.columns), last_row_id)
    if shape[0] <= driver_rows:
        files = lake.storage.write_rows(spec, task(0)[0])
    else:
        description = f"flush inlined rows of {table.schema_name}.{table.name}"
        files = lake.storage.write_job(lake.spark, spec, 1, task, description)
    if [f.record_count for f in files] != [shape[0]]:  # removed meanwhile (DuckDB flushed them, say)
        lake.storage.remove(table.directory, files)
        raise CommitConflict(f"inlined rows of DuckLake table {table.table_id} changed while the task read them")
    file = own_stats(table.columns, files[0])
    begins = pc.min_max(rows["begin_snapshot"])
    placed = Placed(rows["row_id"][0].as_py(), begins["min"].as_py(), begins["max"].as_py())
    deletes, deletes_begin = None, 0
    if shape[1]:
        positions = pa.table(
            {
                "pos": pa.array(range(rows.num_rows), pa.int64()).filter(ended),
                SNAPSHOT.name: rows["end_snapshot"].filter(ended),
            }
        )
        try:
            deletes = lake.storage.write_delete(table, table.directory + file.name, positions)
        except BaseException:
            lake.storage.remove(table.directory, [file])
            raise
        deletes_begin = pc.min(positions[SNAPSHOT.name]).as_py()
    return InlinedFlush(shape, last_row_id, Composed(file, placed, deletes, deletes_begin))


@dataclass(frozen=True)
class FlushRows:
    """A flush's rows: those of an inlined data table up to a row id, read from the catalog (in the Spark task,
    which it is pickled into, or on the driver), with their ids and the snapshots that inserted them."""

    catalog_url: str = field(repr=False)
    name: str
    columns: tuple[LakeColumn, ...]
    last_row_id: int

    def __call__(self, _index: int) -> list[pa.Table]:
        engine = engine_for(self.catalog_url)
        try:
            with engine.connect() as conn:
                rows = inlined.read(conn, self.name, self.columns, Form.FILE, live=False, up_to=self.last_row_id)
        finally:
            engine.dispose()
        values = rows.select([c.name for c in self.columns])
        return [values.append_column(ROW_ID.name, rows["row_id"]).append_column(SNAPSHOT.name, rows["begin_snapshot"])]


def flush_inlined(lake: Lake, table: LakeTable, attempts: int, driver_rows: int) -> int:
    """Flush the table's inlined rows, one snapshot per inlined data table; how many it flushed (live and
    ended)."""
    names = lake.catalog.inlined_tables(table)
    return sum(flush_inlined_table(lake, table, name, attempts, driver_rows) for name in names)


def flush_inlined_table(lake: Lake, table: LakeTable, name: str, attempts: int, driver_rows: int) -> int:
    """Flush the rows of inlined data table ``name`` in one snapshot; how many it flushed.

    A writer that changes the rows meanwhile (DuckDB flushing them itself) makes it start over; rows inserted
    meanwhile stay inlined. A table dropped meanwhile has nothing left to flush.
    """
    for _ in range(attempts):
        started = time.perf_counter()
        base = lake.catalog.latest_snapshot()
        flush = None
        try:
            flush = write_flush(lake, table, name, driver_rows)
            if flush is None:
                return 0
            lake.catalog.commit(
                partial(_apply, table=table, name=name, flush=flush), base_snapshot=base, tables=[table.table_id]
            )
        except CommitConflict as conflict:
            _discard(lake, table, flush)
            if lake.catalog.table(table.table_id) is None:
                return 0
            log.info("inlined rows changed while flushing them; again", table_id=table.table_id, reason=str(conflict))
            continue
        except BaseException:
            _discard(lake, table, flush)
            raise
        log.info(
            "flushed inlined rows",
            table=f"{table.schema_name}.{table.name}",
            rows=flush.shape[0],
            seconds=round(time.perf_counter() - started, 3),
        )
        return flush.shape[0]
    raise DestinationError(
        f"could not flush the inlined rows of DuckLake table {table.schema_name}.{table.name}: they kept changing",
        hint="pause other writers of the lake (DuckDB) and retry",
    )


def _apply(txn: Transaction, *, table: LakeTable, name: str, flush: InlinedFlush) -> None:
    txn.flush_inlined_rows(txn.table(table.table_id), name, flush)


def _discard(lake: Lake, table: LakeTable, flush: InlinedFlush | None) -> None:
    if flush is not None:
        lake.storage.discard(table.directory, flush.written)


class FlushTimer:
    """When each table's inlined rows are due to be flushed by age: ``interval`` after a batch first inlined
    rows into it (after startup, for tables that hold some already)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._since: dict[int, float] = {}
        self._lock = threading.Lock()

    def inlined(self, table_id: int) -> None:
        with self._lock:
            self._since.setdefault(table_id, time.monotonic())

    def flushed(self, table_id: int) -> None:
        with self._lock:
            self._since.pop(table_id, None)

    def due(self) -> list[int]:
        now = time.monotonic()
        with self._lock:
            return [t for t, since in self._since.items() if now - since >= self.interval]
