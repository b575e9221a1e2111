"""A table's copy, or an incremental copy's chunk, as a frame whose rows Spark's tasks read from the source.

The frame has a partition per copy task (``etl_spark.copy_tasks``): each task reads its ranges with the engine's
copy code and turns the rows into their staging form (``types.staged_rows``) where it runs, so no copied row
passes through the driver. ``Jobs.staging`` writes each partition as a Parquet file of the staging location,
for one load job.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from etl.api import arrow_field
from etl_spark.bigquery.types import staged_rows
from etl_spark.copy_tasks import TaskRanges
from etl_spark.task_setup import prepare_task

if TYPE_CHECKING:
    from pyspark import Accumulator
    from pyspark.sql import DataFrame, SparkSession


def copied_rows(spark: SparkSession, ranges: TaskRanges) -> tuple[DataFrame, Accumulator[int]]:
    """The rows of ``ranges``' plan in staging form, read by a task per partition when the frame is written, and
    an accumulator its tasks add their row counts to (at least the rows written: a task run again adds again)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = ranges.plan.schema
    empty = pa.schema([arrow_field(c) for c in schema.columns]).empty_table()
    staged = staged_rows(schema, empty, changes=False).schema
    tasks = max(1, ranges.tasks)
    counted = spark.sparkContext.accumulator(0)
    task = _StagedTask(ranges, counted)
    return spark.range(tasks, numPartitions=tasks).mapInArrow(task, from_arrow_schema(staged)), counted


@dataclass(frozen=True)
class _StagedTask:
    """A task of ``copied_rows``: a class of this module, so Spark's workers run the code they import."""

    ranges: TaskRanges
    counted: Accumulator[int]

    def __call__(self, indexes: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        prepare_task()
        schema = self.ranges.plan.schema
        for batch in indexes:
            for index in pc.cast(batch.column(0), pa.int64()).to_pylist():
                for rows in self.ranges(index):
                    self.counted.add(rows.num_rows)
                    yield from staged_rows(schema, pa.Table.from_batches([rows]), changes=False).to_batches()
