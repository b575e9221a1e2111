"""Collapse a batch of changes to its net effect, for destinations that apply batches as set operations.

Two steps, both column-wise:

- in Arrow, on the driver (cheap): drop changes at or below a watermark, and cut the batch at its
  last truncate (what came before it no longer matters);
- in Spark: for tables with a replica identity key, the last change per key ordered by
  ``(commit_lsn, tx_ordinal)`` decides the key's final state (an update that changes the key is a
  delete of the old key plus an upsert of the new one); for ``REPLICA IDENTITY FULL`` tables
  without a key, the net count of each whole-row image (inserts minus deletes), which is order
  independent because Postgres only deletes rows that exist.

A batch is already in driver memory, in stream order, so ``last_change_per_key_arrow`` computes the
same last change per key there, in Arrow, with no Spark job (a Spark job costs about a second
whatever its size); it serves batches without unchanged TOAST values.

Unchanged TOAST values (named in ``_etl_missing``) are filled from the key's previous image in the
same batch; what remains missing is left for the destination to take from its stored row.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.api import COMMIT_LSN_COLUMN, MISSING_COLUMN, OLD_COLUMN, OP_COLUMN, TX_ORDINAL_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

ACTION: Final = "_etl_action"
"""``upsert`` (the row must hold this image) or ``delete`` (the key must be absent)."""
UPSERT: Final = "upsert"
DELETE: Final = "delete"
PRIOR_KEY: Final = "_etl_prior_key"
"""Struct of the key columns whose stored row holds values still missing from an upsert."""
NET: Final = "_etl_net"
"""For tables without a key: how many copies of the row image to add (>0) or delete (<0)."""

Position = tuple[int, int]


def last_position(changes: pa.Table) -> Position | None:
    """``(commit_lsn, tx_ordinal)`` of the last change, or ``None`` for an empty table."""
    if changes.num_rows == 0:
        return None
    last = changes.num_rows - 1
    return int(changes[COMMIT_LSN_COLUMN][last].as_py()), int(changes[TX_ORDINAL_COLUMN][last].as_py())


def after(changes: pa.Table, watermark: Position) -> pa.Table:
    """The changes strictly after ``watermark`` (replays of applied changes are dropped exactly).

    ``changes`` are in stream order, so their positions ascend and the ones after the watermark are a tail:
    found by binary search and sliced, with no copy (a filter would copy every column of the batch).
    """
    lsns = changes[COMMIT_LSN_COLUMN].to_numpy()
    lsn = lsns.dtype.type(watermark[0])  # of the column's type: a Python int would compare as a float64
    first = int(np.searchsorted(lsns, lsn, side="left"))
    end = int(np.searchsorted(lsns, lsn, side="right"))
    if first < end:  # changes at the watermark's commit: those of later ordinals are after it
        ordinals = changes[TX_ORDINAL_COLUMN].slice(first, end - first).to_numpy()
        first += int(np.searchsorted(ordinals, ordinals.dtype.type(watermark[1]), side="right"))
    return changes.slice(first)


def after_last_truncate(changes: pa.Table) -> tuple[bool, pa.Table]:
    """Whether the changes hold a truncate, and the changes after the last one."""
    truncates = pc.indices_nonzero(pc.equal(changes[OP_COLUMN], "T"))
    if len(truncates) == 0:
        return False, changes
    last = truncates[len(truncates) - 1].as_py()
    return True, changes.slice(last + 1)


def missing_columns(changes: pa.Table) -> list[str]:
    """Names of the columns some change marks as unchanged TOAST."""
    if MISSING_COLUMN not in changes.column_names or changes.num_rows == 0:
        return []
    names = pc.list_flatten(changes[MISSING_COLUMN])
    return sorted(v for v in pc.unique(names).to_pylist() if v is not None)


def last_change_per_key_arrow(changes: pa.Table, columns: Sequence[str], key: Sequence[str]) -> pa.Table:
    """``last_change_per_key`` for a batch without unchanged TOAST values, in Arrow: ``columns`` and ``ACTION``.

    ``changes`` are in stream order (no truncates), so a key's last change is its last touch in the
    table; an update that changes the key also touches the old key, with a delete.
    """
    if missing_columns(changes):
        raise ValueError("last_change_per_key_arrow does not fill unchanged TOAST values; use last_change_per_key")
    op = changes[OP_COLUMN]
    order = pa.array(np.arange(changes.num_rows, dtype=np.int64))
    action = pc.if_else(pc.equal(op, "D"), DELETE, UPSERT)
    images = changes.select(list(columns)).append_column(ACTION, action).append_column("_etl_order", order)
    old = changes[OLD_COLUMN].combine_chunks()
    old_key = {k: old.field(k) for k in key}
    differs = reduce(pc.or_, [pc.invert(_equal_null_safe(comparable(old_key[k]), comparable(changes[k]))) for k in key])
    moves = pc.and_(pc.and_(pc.equal(op, "U"), old.is_valid()), differs)
    count = int(pc.sum(moves).as_py() or 0)
    moved = pa.table(
        [old_key[c].filter(moves) if c in old_key else pa.nulls(count, changes.schema.field(c).type) for c in columns],
        names=list(columns),
    )
    moved = moved.append_column(ACTION, pa.array([DELETE] * count, pa.string()))
    moved = moved.append_column("_etl_order", order.filter(moves))
    touches = pa.concat_tables([images, moved]).sort_by("_etl_order")
    position = pa.array(np.arange(touches.num_rows, dtype=np.int64))
    last = pa.table([comparable(touches[k]) for k in key], names=list(key)).append_column("_etl_position", position)
    winners = last.group_by(list(key), use_threads=False).aggregate([("_etl_position", "max")])
    return touches.take(winners["_etl_position_max"]).drop_columns(["_etl_order"])


def comparable(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Key values as pyarrow's ``equal``, ``group_by`` and joins take them: a list (an array key) as a canonical
    binary encoding, equal exactly when the lists are (each element length-prefixed, so none runs into the next);
    any other type as it is."""
    if isinstance(values, pa.ChunkedArray):
        return pa.chunked_array([comparable(chunk) for chunk in values.chunks], _encoded_type(values.type))
    if not (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)):
        return values
    flat = values.flatten()
    elements = comparable(flat) if _encoded_type(flat.type) == pa.binary() else _element_bytes(flat)
    length = pc.cast(pc.cast(pc.binary_length(elements), pa.string()), pa.binary())
    framed = pc.binary_join_element_wise(_BYTES[b"v"], length, _BYTES[b":"], elements, _BYTES[b""])
    tagged = pc.fill_null(framed, _BYTES[b"n"])  # a null element: "n"
    offsets = pc.subtract(values.offsets, values.offsets[0])
    lists = pa.ListArray.from_arrays(offsets, tagged, mask=values.is_null() if values.null_count else None)
    return pc.binary_join(lists, _BYTES[b""])


_BYTES: Final = {b: pa.scalar(b, pa.binary()) for b in (b"v", b":", b"n", b"")}


def _encoded_type(kind: pa.DataType) -> pa.DataType:
    return pa.binary() if pa.types.is_list(kind) or pa.types.is_large_list(kind) else kind


def _element_bytes(values: pa.Array) -> pa.Array:
    kind = values.type.storage_type if isinstance(values.type, pa.BaseExtensionType) else values.type
    storage = values.storage if isinstance(values, pa.ExtensionArray) else values
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return pc.cast(storage, pa.binary())
    if pa.types.is_date32(kind) or pa.types.is_timestamp(kind) or pa.types.is_time(kind):
        storage = storage.cast(pa.int32() if pa.types.is_date32(kind) or kind == pa.time32("s") else pa.int64())
    return pc.cast(pc.cast(storage, pa.string()), pa.binary())


def _equal_null_safe(left: pa.Array | pa.ChunkedArray, right: pa.Array | pa.ChunkedArray) -> pa.Array:
    both_null = pc.and_(pc.is_null(left), pc.is_null(right))
    return pc.or_(pc.fill_null(pc.equal(left, right), False), both_null)


def _key_equal(left: Sequence[Column], right: Sequence[Column]) -> Column:
    return reduce(lambda a, b: a & b, [lc.eqNullSafe(rc) for lc, rc in zip(left, right, strict=True)])


def last_change_per_key(
    changes: DataFrame, columns: Sequence[str], key: Sequence[str], toast: Sequence[str] = ()
) -> DataFrame:
    """Per key, the row image or deletion that is its net effect.

    ``changes`` holds the row columns and the ``_etl_*`` metadata columns (no truncates). The result
    has the row columns, ``ACTION``, ``PRIOR_KEY`` and ``_etl_missing`` (columns still missing after
    filling ``toast`` columns from earlier images of the key in the batch).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    op, old = sf.col(OP_COLUMN), sf.col(OLD_COLUMN)
    new_key = [sf.col(k) for k in key]
    old_key = [old[k] for k in key]
    has_old = old.isNotNull()
    position = [sf.col(COMMIT_LSN_COLUMN), sf.col(TX_ORDINAL_COLUMN)]
    missing = sf.coalesce(sf.col(MISSING_COLUMN), sf.array().cast("array<string>"))
    prior = sf.when(has_old, sf.struct(*[o.alias(k) for o, k in zip(old_key, key, strict=True)])).otherwise(
        sf.struct(*new_key)
    )
    images = changes.select(
        *[sf.col(c) for c in columns],
        sf.when(op == "D", sf.lit(DELETE)).otherwise(sf.lit(UPSERT)).alias(ACTION),
        prior.alias(PRIOR_KEY),
        missing.alias(MISSING_COLUMN),
        *position,
    )
    moved = changes.filter((op == "U") & has_old & ~_key_equal(old_key, new_key)).select(
        *[(old[c] if c in key else sf.lit(None).cast(changes.schema[c].dataType)).alias(c) for c in columns],
        sf.lit(DELETE).alias(ACTION),
        sf.struct(*[o.alias(k) for o, k in zip(old_key, key, strict=True)]).alias(PRIOR_KEY),
        sf.array().cast("array<string>").alias(MISSING_COLUMN),
        *position,
    )
    touches = images.unionByName(moved)
    if toast:
        earlier = Window.partitionBy(*key).orderBy(*position).rowsBetween(Window.unboundedPreceding, Window.currentRow)
        for name in toast:
            known = (sf.col(ACTION) == UPSERT) & ~sf.array_contains(sf.col(MISSING_COLUMN), name)
            latest = sf.last(sf.when(known, sf.struct(sf.col(name).alias("v"))), ignorenulls=True).over(earlier)
            touches = touches.withColumn(f"_etl_fill_{name}", latest)
        for name in toast:
            fill = sf.col(f"_etl_fill_{name}")
            touches = touches.withColumn(name, sf.when(fill.isNotNull(), fill["v"]).otherwise(sf.col(name)))
        remaining = sf.filter(sf.col(MISSING_COLUMN), lambda m: ~_filled(m, toast))
        touches = touches.withColumn(MISSING_COLUMN, remaining).drop(*[f"_etl_fill_{n}" for n in toast])
    latest_first = Window.partitionBy(*key).orderBy(*[p.desc() for p in position], sf.col(ACTION).desc())
    return (
        touches.withColumn("_etl_rank", sf.row_number().over(latest_first))
        .filter(sf.col("_etl_rank") == 1)
        .drop("_etl_rank", COMMIT_LSN_COLUMN, TX_ORDINAL_COLUMN)
    )


def _filled(name: Column, toast: Sequence[str]) -> Column:
    from pyspark.sql import functions as sf

    checks = [(name == sf.lit(t)) & sf.col(f"_etl_fill_{t}").isNotNull() for t in toast]
    result = checks[0]
    for check in checks[1:]:
        result = result | check
    return result


def net_changes_without_key(changes: DataFrame, columns: Sequence[str]) -> DataFrame:
    """Per distinct row image, ``NET`` = copies inserted minus copies deleted (non-zero only).

    An update adds its new image and removes its old one (``REPLICA IDENTITY FULL`` sends the whole
    old row); unchanged TOAST values of the new image are taken from the old image.
    """
    from pyspark.sql import functions as sf

    op, old = sf.col(OP_COLUMN), sf.col(OLD_COLUMN)
    missing = sf.coalesce(sf.col(MISSING_COLUMN), sf.array().cast("array<string>"))
    new_image = [
        sf.when(sf.array_contains(missing, c) & old.isNotNull(), old[c]).otherwise(sf.col(c)).alias(c) for c in columns
    ]
    added = changes.filter(op.isin("I", "U")).select(*new_image, sf.lit(1).alias(NET))
    removed_deletes = changes.filter(op == "D").select(*[sf.col(c) for c in columns], sf.lit(-1).alias(NET))
    removed_updates = changes.filter((op == "U") & old.isNotNull()).select(
        *[old[c].alias(c) for c in columns], sf.lit(-1).alias(NET)
    )
    return (
        added.unionByName(removed_deletes)
        .unionByName(removed_updates)
        .groupBy(*columns)
        .agg(sf.sum(NET).alias(NET))
        .filter(sf.col(NET) != 0)
    )
