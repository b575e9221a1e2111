"""A copy's ranges spread over Spark tasks, and the Spark job that runs them, stopped when the engine stops.

Both Spark destinations copy a table (or an incremental copy's chunk) as one Spark job over the ranges of the
engine's copy plan. The job has a task per executor core (Spark's default parallelism), at most one per range;
task ``i`` of ``n`` reads ranges ``i``, ``i + n``, ... one after another, on one connection of its own to the
source that imports the plan's exported snapshot, to Arrow with the engine's copy code
(``etl.api.read_ranges``). A task per range would cost Spark's per-task overhead, measured at 60-120 ms on the
copy bench (a fifth of a range's copy there), once per range instead of once per core. No copied row passes
through the driver.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from etl.api import (
    RANGES_PER_CONNECTION,
    CopyPlan,
    CopyRange,
    CopyStopped,
    EtlError,
    TableError,
    TransientError,
    read_ranges,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

T = TypeVar("T")
_STOP_POLL = 0.5


def copy_tasks(ranges: Sequence[CopyRange], parallelism: int) -> int:
    """The tasks of a copy of ``ranges``: one per executor core (``parallelism``), at most one per range, and at
    least one per copy connection the ranges were planned for (``[copy] connections``: the ranges of one
    source table over ``RANGES_PER_CONNECTION``). On a cluster whose executors have not all registered yet Spark
    counts only those that have (or 2), and a copy started then would run on that few cores for good."""
    if not ranges:
        return 0
    connections = max(Counter(piece.source for piece in ranges).values()) // RANGES_PER_CONNECTION
    return min(len(ranges), max(parallelism, connections, 1))


@dataclass(frozen=True)
class TaskRanges:
    """The rows of copy task ``i`` of ``tasks``: ranges ``i``, ``i + tasks``, ... of ``plan``, in turn."""

    plan: CopyPlan
    tasks: int

    def __call__(self, task: int) -> Iterator[pa.RecordBatch]:
        return read_ranges(self.plan, range(task, len(self.plan.ranges), self.tasks))


def task_ranges(spark: SparkSession, plan: CopyPlan) -> TaskRanges:
    """The ranges of ``plan`` spread over as many tasks as ``copy_tasks`` gives on ``spark``'s executors."""
    return TaskRanges(plan, copy_tasks(plan.ranges, spark.sparkContext.defaultParallelism))


def run_copy_job(spark: SparkSession, ranges: TaskRanges, stop: threading.Event, work: Callable[[], T]) -> T:
    """Run ``work`` (the Spark job whose tasks read ``ranges``) in a job group of its own, described in Spark's UI;
    cancelled when ``stop`` is set (``CopyStopped``), its failure as the engine's error (``task_error``)."""
    plan = ranges.plan
    description = f"etl: copy {plan.schema.name} ({len(plan.ranges)} ranges in {ranges.tasks} tasks)"
    try:
        return cancellable(spark, stop, description, work)
    except CopyStopped:
        raise
    except Exception as exc:
        raise task_error(exc, f"the Spark copy of {plan.schema.name}") from None


def cancellable(spark: SparkSession, stop: threading.Event, description: str, work: Callable[[], T]) -> T:
    """Run ``work`` (Spark jobs) in a job group of its own; cancel the group and raise ``CopyStopped`` once
    ``stop`` is set."""
    group = f"etl-{uuid.uuid4()}"
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        spark.sparkContext.setJobGroup(group, description, interruptOnCancel=True)
        try:
            outcome.append(work())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="spark-job", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(_STOP_POLL)
        if stop.is_set() and thread.is_alive():
            spark.sparkContext.cancelJobGroup(group)
            thread.join()
            _wait_tasks_ended(spark, group)
            raise CopyStopped(f"{description}: stopped")
    if failure:
        raise failure[0]
    return outcome[0]


def _wait_tasks_ended(spark: SparkSession, group: str, timeout: float = 60.0) -> None:
    """Wait until the cancelled group's tasks have ended: their Python workers may run on (and write files)
    until Spark kills them (``spark.python.task.killTimeout``), after the job itself reports cancelled."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stages = [
            info
            for job in tracker.getJobIdsForGroup(group)
            if (job_info := tracker.getJobInfo(job)) is not None
            for stage in job_info.stageIds
            if (info := tracker.getStageInfo(stage)) is not None
        ]
        if all(stage.numActiveTasks == 0 for stage in stages):
            return
        time.sleep(_STOP_POLL)


def task_error(exc: Exception, doing: str) -> EtlError:
    """A failed Spark job as the engine's error: the task's own error, when it was one of the engine's."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    # A Python task's error ends its traceback as "etl.errors.TableError: <message>".
    last = next((line for line in reversed(lines) if line.startswith("etl.") and ": " in line), None)
    detail = last.split(": ", 1)[1] if last else (lines[0] if lines else repr(exc))
    if last and ("TransientError" in last or "CopyStopped" in last):
        return TransientError(f"{doing} failed: {detail}", hint="the connection to the source was lost; retried")
    return TableError(f"{doing} failed: {detail}", hint="see the error above; fix its cause, then copy the table again")
