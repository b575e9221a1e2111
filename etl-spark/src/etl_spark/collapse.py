"""Collapse a batch of changes to its net effect, for destinations that apply batches as set operations.

Column-wise, on the driver (a batch is in its memory already, in stream order; a Spark job would cost about a
second whatever its size):

- drop changes at or below a watermark, and cut the batch at its last truncate (what came before it no
  longer matters);
- for tables with a replica identity key, the last change per key in stream order decides the key's final
  state (an update that changes the key is a delete of the old key plus an upsert of the new one):
  ``last_change_per_key_arrow``. Unchanged TOAST values (named in ``_etl_missing``) are filled from the key's
  earlier images in the batch, through the keys an update moved the row from; what remains missing is left for
  the destination to take from the stored row named by ``PRIOR_KEY``.

For ``REPLICA IDENTITY FULL`` tables without a key, Spark counts each whole-row image (inserts minus deletes,
order independent because Postgres only deletes rows that exist): ``net_changes_without_key``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.api import COMMIT_LSN_COLUMN, MISSING_COLUMN, OLD_COLUMN, OP_COLUMN, TX_ORDINAL_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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


def last_change_per_key_arrow(
    changes: pa.Table, columns: Sequence[str], key: Sequence[str], toast: Sequence[str] = ()
) -> pa.Table:
    """Per key, the row image or deletion that is its net effect: ``columns`` and ``ACTION``; with ``toast`` (the
    batch's unchanged TOAST columns, ``missing_columns``) also ``_etl_missing`` (what is still missing after filling
    from the batch) and ``PRIOR_KEY`` (the key of the stored row that holds it).

    ``changes`` are in stream order (no truncates), so a key's last change is its last touch in the
    table; an update that changes the key also touches the old key, with a delete.
    """
    if not set(missing_columns(changes)) <= set(toast):
        raise ValueError("unchanged TOAST values in columns not named in toast")
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
    if toast:
        prior = [pc.if_else(old.is_valid(), old_key[k], changes[k]) for k in key]
        images = images.append_column(PRIOR_KEY, pa.StructArray.from_arrays(_combined(prior), list(key)))
        images = images.append_column(MISSING_COLUMN, _missing_lists(changes))
        moved_prior = [old_key[k].filter(moves) for k in key]
        moved = moved.append_column(PRIOR_KEY, pa.StructArray.from_arrays(_combined(moved_prior), list(key)))
        moved = moved.append_column(MISSING_COLUMN, pa.array([[]] * count, pa.list_(pa.string())))
    touches = pa.concat_tables([images, moved]).sort_by("_etl_order")
    if toast:
        touches = _fill_from_earlier(touches, key, toast)
    position = pa.array(np.arange(touches.num_rows, dtype=np.int64))
    last = pa.table([comparable(touches[k]) for k in key], names=list(key)).append_column("_etl_position", position)
    winners = last.group_by(list(key), use_threads=False).aggregate([("_etl_position", "max")])
    return touches.take(winners["_etl_position_max"]).drop_columns(["_etl_order"])


def _combined(arrays: Sequence[pa.Array | pa.ChunkedArray]) -> list[pa.Array]:
    return [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]


def _missing_lists(changes: pa.Table) -> pa.Array:
    """Each change's ``_etl_missing``, a list (empty where null)."""
    missing = changes[MISSING_COLUMN].combine_chunks().cast(pa.list_(pa.string()))
    return pc.if_else(missing.is_valid(), missing, pa.scalar([], pa.list_(pa.string())))


def _storage(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """An extension type's values (``uuid``) as their storage, which pyarrow sorts."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return values.storage if isinstance(values, pa.ExtensionArray) else values


def missing_matrix(missing: pa.Array, toast: Sequence[str]) -> np.ndarray:
    """``[row, i]``: whether row's ``_etl_missing`` names ``toast[i]``."""
    found = np.zeros((len(missing), len(toast)), np.bool_)
    if len(missing) == 0:
        return found
    parents = pc.list_parent_indices(missing).to_numpy()
    names = pc.list_flatten(missing)
    for i, name in enumerate(toast):
        found[parents[pc.fill_null(pc.equal(names, name), False).to_numpy(zero_copy_only=False)], i] = True
    return found


def _fill_from_earlier(touches: pa.Table, key: Sequence[str], toast: Sequence[str]) -> pa.Table:
    """``touches`` (in stream order) with each missing value taken from the key's latest earlier image in the
    batch that holds it (through the keys an update moved it from), ``_etl_missing`` naming only what is still
    missing, and ``PRIOR_KEY``, where some is, naming the stored row it comes from: the key of the row before the
    batch that the key's images stem from."""
    n = touches.num_rows
    if n == 0:
        return touches
    keys = pa.table([_storage(comparable(touches[k])) for k in key], names=[f"k{i}" for i in range(len(key))])
    upsert = pc.equal(touches[ACTION], UPSERT).to_numpy(zero_copy_only=False)
    missing = missing_matrix(touches[MISSING_COLUMN].combine_chunks(), toast)
    fill = _within_keys(keys, upsert, missing)
    moves = _moves(touches, upsert)
    if moves:
        _through_moves(keys, upsert, missing, moves, fill)
    sources, stems, remaining = fill.sources, fill.stems, fill.remaining
    for i, name in enumerate(toast):
        if (sources[i] != np.arange(n)).any():
            touches = touches.set_column(touches.column_names.index(name), name, touches[name].take(sources[i]))
    if (stems != np.arange(n)).any():
        touches = touches.set_column(touches.column_names.index(PRIOR_KEY), PRIOR_KEY, touches[PRIOR_KEY].take(stems))
    offsets = np.concatenate([[0], np.cumsum(remaining.sum(axis=1))]).astype(np.int32)
    names = pa.array(list(toast), pa.string()).take(pa.array(np.nonzero(remaining)[1]))
    lists = pa.ListArray.from_arrays(pa.array(offsets), names)
    return touches.set_column(touches.column_names.index(MISSING_COLUMN), MISSING_COLUMN, lists)


@dataclass
class _Fill:
    """Where each touch takes its missing values from (``_fill_from_earlier``)."""

    sources: np.ndarray
    """``[i, row]``: the row whose value of the i-th toast column the row takes."""
    stems: np.ndarray
    """``[row]``: the row whose ``PRIOR_KEY`` the row takes."""
    remaining: np.ndarray
    """``[row, i]``: whether the row still misses the i-th toast column."""


def _within_keys(keys: pa.Table, upsert: np.ndarray, missing: np.ndarray) -> _Fill:
    """Each row's values filled from the latest earlier image of the same key that holds them, among the images it
    had in a row (since the batch began, or since its last delete), whose first names the stored row."""
    n = len(upsert)
    order = pc.sort_indices(
        keys.append_column("_etl_order", pa.array(np.arange(n, dtype=np.int64))),
        [(name, "ascending") for name in keys.column_names] + [("_etl_order", "ascending")],
    ).to_numpy()
    ordered = keys.take(order)
    starts = np.zeros(n, np.bool_)
    starts[0] = True
    starts[1:] = ~upsert[order][:-1]  # after a delete
    for name in ordered.column_names:
        column = ordered[name]
        if n > 1:
            starts[1:] |= ~_equal_null_safe(column.slice(1), column.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    indices = np.arange(n)
    run_first = np.maximum.accumulate(np.where(starts, indices, 0))
    missing_sorted, upsert_sorted = missing[order], upsert[order]
    sources = np.tile(np.arange(n), (missing.shape[1], 1))
    remaining = missing.copy()
    for i in range(missing.shape[1]):
        latest = np.maximum.accumulate(np.where(upsert_sorted & ~missing_sorted[:, i], indices, -1))
        fill = missing_sorted[:, i] & (latest >= run_first)
        sources[i, order] = np.where(fill, order[np.maximum(latest, 0)], order)
        remaining[order, i] &= ~fill
    stems = np.arange(n)
    stems[order] = np.where(remaining[order].any(axis=1), order[run_first], order)
    return _Fill(sources, stems, remaining)


def _moves(touches: pa.Table, upsert: np.ndarray) -> dict[int, int]:
    """The rows of images that moved their key (an update that changed it), each with the row of its moved delete
    (the old key's), as ``last_change_per_key_arrow`` lays them out: the delete right after its image."""
    order = touches["_etl_order"].to_numpy()
    deletes = np.nonzero(~upsert[1:] & upsert[:-1] & (order[1:] == order[:-1]))[0] + 1
    return {int(row) - 1: int(row) for row in deletes}


def _through_moves(
    keys: pa.Table,
    upsert: np.ndarray,
    missing: np.ndarray,
    moves: dict[int, int],
    fill: _Fill,
) -> None:
    """``_within_keys``' answers for the keys that moves connect, replaced by a pass in stream order that follows
    each value through the keys it moved from (the other keys' images depend on their own key only)."""
    ends = np.array([row for pair in moves.items() for row in pair])
    involved = np.ones(keys.num_rows, np.bool_)
    for name in keys.column_names:  # the rows whose key a move names (a superset, column by column)
        involved &= pc.is_in(keys[name], value_set=keys[name].take(pa.array(ends))).to_numpy(zero_copy_only=False)
    rows = np.nonzero(involved)[0]
    taken = [keys[name].take(pa.array(rows)).to_pylist() for name in keys.column_names]
    values = dict(zip(rows.tolist(), zip(*taken, strict=True), strict=True))
    moved = {values[int(row)] for row in ends}
    state: dict[tuple[object, ...], tuple[list[int | None], int]] = {}  # a key's value rows and stem row
    for row in (r for r in values if values[r] in moved):
        if not upsert[row]:
            state.pop(values[row], None)
            continue
        came_from = values[moves[row]] if row in moves else values[row]
        before = state.pop(came_from, None)
        held: list[int | None] = [None if missing[row, i] else row for i in range(missing.shape[1])]
        if before is not None:
            held = [mine if mine is not None else theirs for mine, theirs in zip(held, before[0], strict=True)]
        stem = row if before is None else before[1]
        state[values[row]] = (held, stem)
        for i, source in enumerate(held):
            fill.sources[i, row] = row if source is None else source
            fill.remaining[row, i] = source is None
        fill.stems[row] = stem if fill.remaining[row].any() else row


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
