"""Upkeep of the lake while the pipeline runs (``[destination.maintenance]``).

Every ``every_seconds`` the destination's upkeep thread runs these steps, each between two batches
(it holds the batches' lock for one step at a time, so a batch waits for one step at most):

1. per table of this pipeline, **rewrite** the files with many deleted rows, then **merge** its small
   files (``compaction``): a Spark job and a snapshot each, when there is work;
2. **expire** the lake's snapshots older than ``snapshot_retention_seconds`` (snapshots are the
   lake's, not a table's: this expires those of every writer);
3. **clean up**: delete the files scheduled for deletion more than ``cleanup_after_seconds`` ago, and
   files under this pipeline's table directories that the catalog does not know and that are older
   than ``orphan_after_seconds`` (left by a writer that died before its commit); the latter, which
   lists the directories, at most every ``ORPHAN_SWEEP_SECONDS``, and not while a copy runs, whose
   files are registered only at its end.

A step that fails is logged and tried again next round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Final

import structlog
from pydantic import BaseModel, ConfigDict, Field

from etl.api import Integer
from etl_spark.ducklake.catalog import inside
from etl_spark.ducklake.compaction import merge_small_files, rewrite_deleted
from etl_spark.ducklake.lake import Lake
from etl_spark.ducklake.metrics import DuckLakeMetrics
from etl_spark.ducklake.upkeep_thread import Step

log = structlog.get_logger(__name__)

ORPHAN_SWEEP_SECONDS: Final = 600
"""How often, at most, the table directories are listed for files the catalog does not know."""


class MaintenanceConfig(BaseModel):
    """``[destination.maintenance]`` keys of ``type = "ducklake"``: the section turns maintenance on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every_seconds: Integer = Field(60, ge=1, description="How often a round of maintenance looks for work.")
    merge_below_bytes: Integer = Field(
        64 * 1024 * 1024,
        ge=1,
        description="Data files under this size are small: merged into files of up to `target_file_size_bytes`.",
    )
    merge_min_files: Integer = Field(16, ge=2, description="A table's small files are merged once it holds this many.")
    rewrite_delete_ratio: float = Field(
        0.5,
        gt=0,
        le=1,
        description="A data file whose deleted rows reach this share of its rows is rewritten without them.",
    )
    snapshot_retention_seconds: Integer = Field(
        7 * 24 * 3600,
        ge=1,
        description="Snapshots older than this expire; time travel reaches back this far. Snapshots are the lake's:"
        " this expires other writers' too.",
    )
    cleanup_after_seconds: Integer = Field(
        3600,
        ge=0,
        description="Files scheduled for deletion (by merges, expiry, replaced delete files; DuckDB's too) are"
        " deleted once they have waited this long. Keep it above your longest query: a reader that began before"
        " the merge or expiry still reads those files.",
    )
    orphan_after_seconds: Integer = Field(
        24 * 3600,
        ge=60,
        description="Files under this pipeline's table directories that no catalog entry names (left by a writer"
        " that died before its commit) are deleted once this old. Keep it longer than any writer (DuckDB's too)"
        " takes from its first file to its commit.",
    )


class Maintenance:
    """Which steps are due, and the steps themselves."""

    def __init__(self, config: MaintenanceConfig, metrics: DuckLakeMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self._last = self._last_sweep = float("-inf")

    def due(self, lake: Lake, copying: Callable[[], bool]) -> list[Step]:
        """The steps of a round, when ``every_seconds`` have passed since the last one; else none."""
        now = time.monotonic()
        if now - self._last < self.config.every_seconds:
            return []
        self._last = now
        tables = lake.catalog.pipeline_tables()
        steps: list[Step] = []
        for table_id in tables:
            steps += [partial(self.rewrite, lake, table_id), partial(self.merge, lake, table_id)]
        steps += [partial(self.expire, lake), partial(self.cleanup, lake)]
        if now - self._last_sweep >= ORPHAN_SWEEP_SECONDS:
            self._last_sweep = now
            steps.append(partial(self.orphans, lake, copying))
        return steps

    def rewrite(self, lake: Lake, table_id: int) -> None:
        table = lake.catalog.table(table_id)
        if table is not None:
            with self.metrics.maintenance_seconds.labels("rewrite").time():
                self.metrics.maintenance.labels("rewrite").inc(
                    rewrite_deleted(lake, table, self.config.rewrite_delete_ratio)
                )

    def merge(self, lake: Lake, table_id: int) -> None:
        table = lake.catalog.table(table_id)
        if table is not None:
            with self.metrics.maintenance_seconds.labels("merge").time():
                merged = merge_small_files(lake, table, self.config.merge_below_bytes, self.config.merge_min_files)
                self.metrics.maintenance.labels("merge").inc(merged)

    def expire(self, lake: Lake) -> None:
        before = datetime.now(UTC) - timedelta(seconds=self.config.snapshot_retention_seconds)
        with self.metrics.maintenance_seconds.labels("expire").time():
            expired = lake.catalog.expire_snapshots(before)
        if expired:
            self.metrics.maintenance.labels("expire").inc(expired)
            log.info("expired snapshots", snapshots=expired)

    def cleanup(self, lake: Lake) -> None:
        before = datetime.now(UTC) - timedelta(seconds=self.config.cleanup_after_seconds)
        with self.metrics.maintenance_seconds.labels("cleanup").time():
            files = lake.catalog.scheduled_files(before)
            if not files:
                return
            deleted = lake.storage.delete(path for _, path in files)
            lake.catalog.unschedule([file_id for file_id, _ in files])
        self.metrics.maintenance.labels("cleanup").inc(deleted)
        log.info("deleted files scheduled for deletion", files=deleted)

    def orphans(self, lake: Lake, copying: Callable[[], bool]) -> None:
        if copying():
            return
        cutoff = time.time() - self.config.orphan_after_seconds
        with self.metrics.maintenance_seconds.labels("orphans").time():
            tables = [t for i in lake.catalog.pipeline_tables() if (t := lake.catalog.table(i)) is not None]
            directories = sorted({t.directory for t in tables if inside(lake.storage.data_path, t.directory)})
            present = {path: at for d in directories for path, at in lake.storage.files_in(d).items()}
            known = lake.catalog.known_files([t.table_id for t in tables])
            orphans = [path for path, at in present.items() if at < cutoff and path not in known]
            deleted = lake.storage.delete(orphans)
        if deleted:
            self.metrics.maintenance.labels("orphans").inc(deleted)
            log.info("deleted files no writer registered", files=deleted)
