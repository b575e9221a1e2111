"""A table's initial copy as one Spark job over the ranges of the engine's copy plan (``etl_spark.copy_tasks``).

Each task writes data files itself (``parquet_files``) from the ranges it reads, and returns only the files'
metadata: no copied row passes through the driver. A task that fails (its executor killed, say) is run again
by Spark, and the files of failed attempts are removed (``LakeStorage.remove_job``), never registered.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from etl.api import CopyPlan
from etl_spark.copy_tasks import run_copy_job, task_ranges
from etl_spark.ducklake.catalog import NewFile
from etl_spark.ducklake.parquet_files import DataFileSpec
from etl_spark.ducklake.storage import write_indexed

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def copy_files(spark: SparkSession, plan: CopyPlan, spec: DataFileSpec, stop: threading.Event) -> list[NewFile]:
    """Copy every range of ``plan`` into data files (``spec``) on Spark's executors; their metadata."""
    if not plan.ranges:
        return []
    ranges = task_ranges(spark, plan)
    return run_copy_job(spark, ranges, stop, lambda: write_indexed(spark, ranges.tasks, spec, ranges))
