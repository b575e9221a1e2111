"""``mode = "history"``: every change appended to its table as a row, with what it was and when it committed.

A history table has the source's columns (the new row of an insert or update, the old row of a
delete: the key only unless the table has ``REPLICA IDENTITY FULL``; all null for a truncate; an
update that changes the key is also a delete of the old key; a column dropped at the source stays,
renamed ``_etl_dropped_<attnum>_<name>``, so earlier rows keep its values) and
four more: ``_etl_op`` (``copy``, ``insert``, ``update``, ``delete``, ``truncate``),
``_etl_commit_lsn`` and ``_etl_tx_ordinal`` (the change's position: ordered by both, the rows are the
table's changes in source order) and ``_etl_commit_ts`` (the transaction's commit time). Nothing is
ever deleted or updated: a table's watermark, committed with the rows it covers, keeps replays out.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import reduce
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from etl.api import COMMIT_LSN_COLUMN, OLD_COLUMN, OP_COLUMN, TX_ORDINAL_COLUMN, TableSchema
from etl_spark.collapse import comparable

COMMIT_TS: Final = "_etl_commit_ts"
COLUMNS: Final = (
    (OP_COLUMN, "STRING"),
    (COMMIT_LSN_COLUMN, "INT64"),
    (TX_ORDINAL_COLUMN, "INT64"),
    (COMMIT_TS, "TIMESTAMP"),
)
"""The columns a history table has after the source's, with their BigQuery types."""
COPY: Final = "copy"
"""``_etl_op`` of a row of the initial copy (its position and commit time are null)."""
_CODES: Final = ("I", "U", "D", "T")
_OPS: Final = ("insert", "update", "delete", "truncate")
"""Operation codes of change tables and their names in history, as tuples: ``pa.array`` at import time would
have pyarrow import pandas into every ``etl`` command."""


def history_ddl() -> str:
    """The history columns' definitions, to follow the source columns' in ``CREATE TABLE``."""
    return ", ".join(f"{name} {kind}" for name, kind in COLUMNS)


def history_columns(changes: pa.Table, commit_timestamps: Mapping[int, datetime]) -> list[tuple[str, pa.Array]]:
    """The history columns of a change table (``etl.events``): operation names, positions, commit times."""
    codes = pc.index_in(changes[OP_COLUMN].combine_chunks(), value_set=pa.array(_CODES, pa.string()))
    ops = pa.array(_OPS, pa.string()).take(codes)
    lsns = changes[COMMIT_LSN_COLUMN].combine_chunks().cast(pa.int64())  # below 2**63; BigQuery has no unsigned
    known = pa.array(list(commit_timestamps), pa.int64())
    times = pa.array(list(commit_timestamps.values()), pa.timestamp("us", tz="UTC"))
    return [
        (OP_COLUMN, ops),
        (COMMIT_LSN_COLUMN, lsns),
        (TX_ORDINAL_COLUMN, changes[TX_ORDINAL_COLUMN].combine_chunks().cast(pa.int64())),
        (COMMIT_TS, times.take(pc.index_in(lsns, value_set=known))),
    ]


def with_key_change_deletes(changes: pa.Table, schema: TableSchema) -> pa.Table:
    """``changes`` plus, for each update that changed the key, a delete of the old key at the update's position.

    So the old key's history ends with a delete, as if the row had been deleted and inserted anew:
    the latest row per key (by ``_etl_commit_lsn``, ``_etl_tx_ordinal``) tells which keys exist.
    """
    key = [c.name for c in schema.key_columns]
    old = changes[OLD_COLUMN].combine_chunks()
    if not key or old.null_count == len(old):
        return changes
    # Changed if any key column differs (an array one compared in its canonical encoding: no kernel compares lists).
    changed = reduce(
        pc.or_, (pc.fill_null(pc.not_equal(comparable(changes[n]), comparable(old.field(n))), True) for n in key)
    )
    moved = pc.and_(pc.and_(pc.equal(changes[OP_COLUMN], "U"), old.is_valid()), changed)
    if isinstance(moved, pa.ChunkedArray):
        moved = moved.combine_chunks()
    deletes = changes.filter(moved)
    if not deletes.num_rows:
        return changes
    olds = old.filter(moved)
    for column in schema.columns:  # the old row (its key, or all of it with REPLICA IDENTITY FULL) as the row
        index = deletes.column_names.index(column.name)
        deletes = deletes.set_column(index, column.name, olds.field(column.name))
    ops = pa.array(["D"] * deletes.num_rows, changes.schema.field(OP_COLUMN).type)
    deletes = deletes.set_column(deletes.column_names.index(OP_COLUMN), OP_COLUMN, ops)
    return pa.concat_tables([changes, deletes], promote_options="permissive")


def with_history(rows: pa.Table, changes: pa.Table, commit_timestamps: Mapping[int, datetime]) -> pa.Table:
    """``rows`` (the changes' row columns in staging form) with the history columns after them."""
    for name, values in history_columns(changes, commit_timestamps):
        rows = rows.append_column(name, values)
    return rows


def own_columns(columns: list[str]) -> frozenset[str]:
    """A history table's columns that are not the source's: the history columns and the dropped source
    columns kept under ``_etl_dropped_...`` (no source column starts with ``_etl_``)."""
    return frozenset(c for c in columns if c.startswith("_etl_"))


def is_history_table(columns: list[str]) -> bool:
    """Whether a BigQuery table with ``columns`` was created in history mode (source columns never start
    with ``_etl_``)."""
    return OP_COLUMN in columns
