"""One staging table for many tables' rows: the frames of a write side by side, loaded by one load job.

BigQuery counts every load job against daily quotas (per destination table, and per project), so a
batch touching many tables loads them all at once (in more than one load only past BigQuery's
10,000 columns per table). Each part (one table's staged rows) keeps its
columns under positional names, ``_etl_p<part>_<column>``, and a ``_etl_part`` column says which part a
row belongs to; the other parts' columns are null in it, which Parquet stores for almost nothing. A
part reads back, under its own column names, through ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Final

from etl_spark.bigquery.names import STAGING_PREFIX
from etl_spark.collapse import PRIOR_KEY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

PART: Final = "_etl_part"
MISSING_TEXT: Final = "_etl_missing_text"
"""Unchanged TOAST column names as ``,a,b,`` (staged without Parquet lists)."""
MAX_COLUMNS: Final = 10_000 - 1
"""BigQuery's limit on a table's columns, less ``_etl_part``."""


@dataclass(frozen=True)
class Part:
    """Where one frame's rows are in a staging table."""

    index: int
    columns: tuple[str, ...]
    """The frame's own column names, in order."""

    def staged(self, position: int) -> str:
        return f"_etl_p{self.index}_{position}"


def side_by_side(frames: list[DataFrame]) -> tuple[DataFrame, list[Part]]:
    """One frame holding every frame's rows, each under its own part's columns."""
    from pyspark.sql import functions as sf

    parts = [Part(i, tuple(frame.columns)) for i, frame in enumerate(frames)]
    renamed = [
        frame.toDF(*(part.staged(p) for p in range(len(part.columns)))).withColumn(PART, sf.lit(part.index))
        for frame, part in zip(frames, parts, strict=True)
    ]
    return reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), renamed), parts


def groups(frames: list[DataFrame], max_columns: int = MAX_COLUMNS) -> list[list[DataFrame]]:
    """``frames`` in order, cut into as few runs as keep each staging table within ``max_columns``."""
    runs: list[list[DataFrame]] = []
    width = 0
    for frame in frames:
        if not runs or width + len(frame.columns) > max_columns:
            runs.append([])
            width = 0
        runs[-1].append(frame)
        width += len(frame.columns)
    return runs


def source(table: str, part: Part) -> str:
    """A subquery of ``part``'s rows in the staging table ``table`` (a quoted reference), under their own names."""
    columns = ", ".join(f"`{part.staged(p)}` AS `{name}`" for p, name in enumerate(part.columns))
    return f"(SELECT {columns} FROM {table} WHERE {PART} = {part.index})"


def table_prefix(pipeline_id: int) -> str:
    """The names of a pipeline's staging tables start with this (one table per load, dropped after use)."""
    return f"{STAGING_PREFIX}{int(pipeline_id)}_"


def flatten_changes(collapsed: DataFrame, key: list[str]) -> DataFrame:
    """Collapsed changes in the columns they are staged in: the prior key as ``_etl_prior_<column>`` columns, the
    unchanged TOAST columns as ``MISSING_TEXT`` (Parquet lists would need list inference to load)."""
    from pyspark.sql import functions as sf

    return collapsed.select(
        *[sf.col(c) for c in collapsed.columns if c not in (PRIOR_KEY, "_etl_missing")],
        *[sf.col(PRIOR_KEY)[k].alias(f"_etl_prior_{k}") for k in key],
        sf.concat(sf.lit(","), sf.array_join(sf.col("_etl_missing"), ","), sf.lit(",")).alias(MISSING_TEXT),
    )
