"""The lake's stored rows that a batch's changes touch, for ``plan``: read on the driver, or with Spark.

Which data files may hold the changed keys (their column statistics), the table's live rows (its files less
their deletes, and its live inlined rows), unchanged TOAST values filled from the stored rows (``StoredValues`` on
the driver, ``fill_from_lake`` in Spark), the stored occurrences a keyless delete removes, and the positions of all
of these per data file for its delete file.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.api import MISSING_COLUMN
from etl_spark.collapse import NET, PRIOR_KEY, missing_matrix
from etl_spark.ducklake.catalog import DataFile, LakeColumn
from etl_spark.ducklake.lake import Lake
from etl_spark.ducklake.scan import file_name, read_live
from etl_spark.ducklake.storage import LakeStorage
from etl_spark.ducklake.types import Form, arrow_of, convert

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

INLINED = "_etl_inlined"
"""The ``_etl_file`` of inlined rows in a live-rows frame, whose ``_etl_pos`` is their row id."""


def may_hold(
    bounds: dict[int, tuple[int, int]], column: LakeColumn, keys: pa.ChunkedArray, data_files: list[DataFile]
) -> list[DataFile]:
    """The data files that may hold one of ``keys`` (values of a one-column key): for an integer key, those
    whose ``bounds`` (file column statistics) contain one; otherwise, or for files without bounds, all of them."""
    if not column.type.startswith("int"):
        return data_files
    wanted = np.sort(keys.drop_null().to_numpy())

    def holds(data_file: DataFile) -> bool:
        if data_file.data_file_id not in bounds:
            return True
        low, high = bounds[data_file.data_file_id]
        return bool(np.searchsorted(wanted, low) < np.searchsorted(wanted, high, side="right"))

    return [f for f in data_files if holds(f)]


@dataclass(frozen=True)
class StoredValues:
    """Where the driver reads a batch's stored rows from: the candidate data files, the rows of them that hold the
    batch's keys (``LakeStorage.positions_of_keys``: ``None`` when no file is a candidate) and the live inlined
    rows of those keys (in their Spark form)."""

    storage: LakeStorage
    data_files: list[DataFile]
    found: pa.Table | None
    inlined_rows: pa.Table | None

    def fill(self, upserts: pa.Table, key: LakeColumn, columns: Sequence[LakeColumn], toast: Sequence[str]) -> pa.Table:
        """``upserts`` (``last_change_per_key_arrow``'s, of a one-column key) with the values still missing taken
        from the live stored row of their ``PRIOR_KEY``, in their file form (``NULL`` where the lake holds no such
        row, as a Spark join leaves them); only the row groups holding those rows are read."""
        missing = missing_matrix(upserts[MISSING_COLUMN].combine_chunks(), toast)
        wanting = missing.any(axis=1)
        if not wanting.any():
            return upserts
        rows = np.nonzero(wanting)[0]
        prior = upserts[PRIOR_KEY].combine_chunks().field(key.name).take(pa.array(rows))
        by_name = {c.name: c for c in columns}
        stored = self._stored(prior, key.name, [by_name[name] for name in toast])
        # Where each wanting row's stored row is (the first, should a key be stored twice), by joining the keys
        # only: a join cannot carry list or struct values (an array column is TOASTed as any other).
        at = stored.select(["_etl_key"]).append_column("_etl_at", pa.array(np.arange(stored.num_rows)))
        first = at.group_by("_etl_key", use_threads=False).aggregate([("_etl_at", "min")])
        wanted = pa.table({"_etl_key": prior, "_etl_row": pa.array(np.arange(len(rows)))})
        found = wanted.join(first, "_etl_key", join_type="left outer").sort_by("_etl_row")["_etl_at_min"]
        none = stored.num_rows  # the row of no stored row: NULL, as a Spark join leaves it
        source = pc.fill_null(found, none).to_numpy(zero_copy_only=False).astype(np.int64)
        n = upserts.num_rows
        for i, name in enumerate(toast):
            mask = missing[:, i]
            if not mask.any():
                continue
            column = convert(upserts[name], by_name[name], Form.FILE).combine_chunks()
            values = stored[name].combine_chunks().cast(column.type)
            indices = np.arange(n, dtype=np.int64)
            indices[rows] = np.where(mask[rows], n + source, rows)
            both = pa.concat_arrays([column, values, pa.nulls(1, column.type)])
            upserts = upserts.set_column(upserts.column_names.index(name), name, both.take(pa.array(indices)))
        return upserts

    def _stored(self, keys: pa.Array, key: str, columns: list[LakeColumn]) -> pa.Table:
        """``_etl_key`` and the values of ``columns`` (file form) of the live stored rows of ``keys``."""
        names = ["_etl_key", *(c.name for c in columns)]
        parts = []
        if self.found is not None and self.found.num_rows:
            found = self.found.filter(pc.is_in(self.found["_etl_key"], value_set=keys))
            by_name = {file_name(f.path): f for f in self.data_files}
            for name in pc.unique(found["_etl_file"]).to_pylist():
                rows = found.filter(pc.equal(found["_etl_file"], name)).sort_by("_etl_pos")
                data_file = by_name[name]
                if data_file.delete is not None:
                    deleted = self.storage.deleted(data_file.delete)["pos"]
                    rows = rows.filter(pc.invert(pc.is_in(rows["_etl_pos"], value_set=deleted)))
                if rows.num_rows:
                    values = self.storage.values_at(data_file.path, rows["_etl_pos"].to_numpy(), columns)
                    parts.append(pa.table([rows["_etl_key"].combine_chunks(), *values], names=names))
        if self.inlined_rows is not None and self.inlined_rows.num_rows:
            inlined = self.inlined_rows
            stored_keys = pc.cast(inlined[key], keys.type)
            inlined = inlined.filter(pc.is_in(stored_keys, value_set=keys))
            values = [convert(inlined[c.name], c, Form.FILE).combine_chunks() for c in columns]
            parts.append(pa.table([pc.cast(inlined[key], keys.type).combine_chunks(), *values], names=names))
        if not parts:
            empty = [pa.array([], keys.type), *(pa.array([], arrow_of(c, Form.FILE)) for c in columns)]
            return pa.table(empty, names=names)
        return pa.concat_tables(parts)


def live_rows(
    lake: Lake, columns: list[LakeColumn], data_files: list[DataFile], inlined_rows: pa.Table | None
) -> DataFrame:
    """The table's live rows: those of its files, and its live inlined rows (``_etl_file`` ``INLINED``)."""
    frames = []
    if data_files:
        deletes = [f.delete.path for f in data_files if f.delete is not None]
        frames.append(read_live(lake.spark, lake.storage, columns, [f.path for f in data_files], deletes))
    if inlined_rows is not None:
        rows = inlined_rows.select([c.name for c in columns])
        rows = rows.append_column("_etl_file", pa.array([INLINED] * rows.num_rows, pa.string()))
        rows = rows.append_column("_etl_pos", inlined_rows["row_id"])
        frames.append(lake.to_spark(rows, columns))
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def fill_from_lake(upserts: DataFrame, live: DataFrame, key: list[str], toast: list[str]) -> DataFrame:
    """Values still missing (unchanged TOAST) come from the stored row of the prior key."""
    if not toast:
        return upserts
    from pyspark.sql import functions as sf

    stored = live.select(
        *[sf.col(k).alias(f"_etl_k_{k}") for k in key], *[sf.col(c).alias(f"_etl_v_{c}") for c in toast]
    )
    condition = None
    for k in key:
        term = upserts[PRIOR_KEY][k] == stored[f"_etl_k_{k}"]
        condition = term if condition is None else condition & term
    joined = upserts.join(stored, condition, "left")
    for name in toast:
        joined = joined.withColumn(
            name,
            sf.when(sf.array_contains(sf.col("_etl_missing"), name), sf.col(f"_etl_v_{name}")).otherwise(sf.col(name)),
        )
    return joined


def occurrences(live: DataFrame, net: DataFrame, names: list[str]) -> DataFrame:
    """For each image deleted ``-NET`` times, that many of its stored occurrences."""
    from pyspark.sql import Window
    from pyspark.sql import functions as sf

    deleted = net.filter(sf.col(NET) < 0).select(
        *[sf.col(n).alias(f"_etl_d_{n}") for n in names], (-sf.col(NET)).alias("_etl_count")
    )
    condition = None
    for n in names:
        term = live[n].eqNullSafe(deleted[f"_etl_d_{n}"])
        condition = term if condition is None else condition & term
    matched = live.join(sf.broadcast(deleted), condition, "inner")
    order = Window.partitionBy(*[f"_etl_d_{n}" for n in names]).orderBy("_etl_file", "_etl_pos")
    return matched.withColumn("_etl_n", sf.row_number().over(order)).filter(sf.col("_etl_n") <= sf.col("_etl_count"))


def removed_copies(net: DataFrame) -> int:
    """How many stored copies the deleted images remove, in all."""
    from pyspark.sql import functions as sf

    total = net.filter(sf.col(NET) < 0).agg(sf.sum(-sf.col(NET))).first()
    return int(total[0] or 0) if total is not None else 0


def copies(net: DataFrame, names: list[str]) -> DataFrame:
    from pyspark.sql import functions as sf

    return (
        net.filter(sf.col(NET) > 0)
        .withColumn("_etl_copy", sf.explode(sf.sequence(sf.lit(1), sf.col(NET))))
        .select(*names)
    )


def matched_positions_and_inlined(
    matches: DataFrame, data_files: list[DataFile], storage: LakeStorage
) -> tuple[dict[int, tuple[DataFile, pa.Array]], list[int]]:
    """``matched_positions`` of the matched file rows, and the row ids of the matched inlined rows."""
    found = matches.select("_etl_file", "_etl_pos").toArrow()
    inlined = pc.equal(found["_etl_file"], INLINED)
    row_ids = sorted(set(found["_etl_pos"].filter(inlined).to_pylist()))
    return file_positions(found.filter(pc.invert(inlined)), data_files, storage), row_ids


def matched_positions(
    matches: DataFrame, data_files: list[DataFile], storage: LakeStorage
) -> dict[int, tuple[DataFile, pa.Array]]:
    """Collect ``(file, position)`` pairs (small: one per changed row) grouped by data file, without the
    positions the file's delete file already holds."""
    return file_positions(matches.select("_etl_file", "_etl_pos").toArrow(), data_files, storage)


def file_positions(
    found: pa.Table, data_files: list[DataFile], storage: LakeStorage
) -> dict[int, tuple[DataFile, pa.Array]]:
    if found.num_rows == 0:
        return {}
    by_name = {file_name(f.path): f for f in data_files}
    result: dict[int, tuple[DataFile, pa.Array]] = {}
    grouped = found.group_by("_etl_file").aggregate([("_etl_pos", "list")])
    for name, positions in zip(grouped["_etl_file"].to_pylist(), grouped["_etl_pos_list"], strict=True):
        data_file = by_name[name]
        wanted = pc.unique(positions.values)
        if data_file.delete is not None:
            deleted = storage.deleted(data_file.delete)["pos"]
            wanted = wanted.filter(pc.invert(pc.is_in(wanted, deleted)))
        if len(wanted):
            result[data_file.data_file_id] = (data_file, wanted)
    return result
