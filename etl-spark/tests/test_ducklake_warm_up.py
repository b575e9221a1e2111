"""A start warms Spark's Python workers: a job imports what etl's tasks import, once per session, so that the first
flush or copy task after a start does not pay for it while the stream waits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from etl_spark.ducklake import warm_up
from etl_spark.ducklake.warm_up import TASK_MODULES, WARM_UP_GROUP, warm_workers


def test_the_workers_import_the_tasks_modules_once_per_session(
    lake: Any, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warm_up, "_warmed", set())  # as in a new session
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(WARM_UP_GROUP))
    for _ in range(2):
        warm_workers(spark, lake.url)
    assert len(set(tracker.getJobIdsForGroup(WARM_UP_GROUP)) - before) == 1

    def imported(_rows: Any) -> Any:
        yield all(name in sys.modules for name in TASK_MODULES)

    slots = spark.sparkContext.defaultParallelism
    assert spark.sparkContext.parallelize(range(slots), slots).mapPartitions(imported).collect() == [True] * slots


def test_the_warm_up_task_loads_the_catalogs_driver_and_connects_to_nothing(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.sqlite"
    script = (
        "import sys\n"
        "from etl_spark.ducklake.warm_up import TASK_MODULES, _import_task_modules\n"
        f"assert list(_import_task_modules('sqlite:///{catalog}', [])) == [1]\n"
        "assert all(name in sys.modules for name in TASK_MODULES) and 'sqlite3' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    assert not catalog.exists()
