"""The ``ducklake`` destination: a DuckLake 1.0 lake, data work on Spark, catalog in SQLite or Postgres.

Each committed write is one DuckLake snapshot. A table's initial copy is one Spark job whose tasks copy ranges
of the source table straight into data files (``copy_job``); the driver registers them all in one snapshot. So
is each chunk of an incremental copy (``stage_chunk``): the tasks read its key ranges in the chunk's snapshot
while the stream goes on, and ``commit_chunk`` registers the files in a snapshot that moves the table's
watermark to the chunk's place in the stream. A batch of changes is collapsed per table
(``etl_spark.collapse``): upserted rows become new data files, and the stored rows they replace or that were
deleted become positional delete files, found by a Spark scan of the table's live rows
(``_metadata.row_index``); ``batch_commits`` plans and commits the batches, the parts of a transaction larger than
a batch included. A truncate ends the table's data files. Data files are written by pyarrow, in the
types DuckDB writes. Schema changes become DuckLake schema versions in the same snapshot. Each table's
replication watermark ``(commit_lsn, tx_ordinal)`` is committed with the snapshot, so a replayed change is
skipped exactly. See docs/destinations/ducklake.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import structlog
from pydantic import BaseModel

from etl.api import (
    APPLY_WORKER,
    Check,
    CopyPlan,
    DestinationContext,
    DestinationError,
    DestinationPosition,
    EventBatch,
    Lsn,
    StagedChunk,
    Store,
    TableName,
    TablePreview,
    TableSchema,
    WriteResult,
    naming_table,
    read_ranges,
    validate,
)
from etl_spark.ducklake.batch_commits import BatchCommits, apply_all
from etl_spark.ducklake.catalog import (
    Catalog,
    CommitConflict,
    LakeOptions,
    LakeTable,
    NewFile,
    redacted,
)
from etl_spark.ducklake.catalog.positions import read_position
from etl_spark.ducklake.config import SPARK_CONF, DuckLakeConfig
from etl_spark.ducklake.copy_job import copy_files
from etl_spark.ducklake.inline_flush import FlushTimer, flush_inlined
from etl_spark.ducklake.lake import Lake
from etl_spark.ducklake.maintenance import Maintenance
from etl_spark.ducklake.metrics import DuckLakeMetrics
from etl_spark.ducklake.open_transaction import remove_staged
from etl_spark.ducklake.parquet_files import DataFileSpec, ParquetOptions, write_data_files
from etl_spark.ducklake.plan import FlushFirst, TablePlan, plan_copy
from etl_spark.ducklake.preflight import deep_preflight, preflight
from etl_spark.ducklake.reader import open_lake
from etl_spark.ducklake.storage import LakeStorage
from etl_spark.ducklake.upkeep_thread import UPKEEP_SECONDS, Step, Turns, Upkeep
from etl_spark.ducklake.warm_up import WarmUp
from etl_spark.session import get_spark, require_java, start_in_background

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)

_PLANNER = "ducklake-plan"
"""The name prefix of planning threads."""


class DuckLakeDestination:
    """Writes a pipeline's tables into a DuckLake lake (see the module docstring)."""

    name: ClassVar[str] = "ducklake"
    Config: ClassVar[type[BaseModel]] = DuckLakeConfig

    def __init__(self, config: DuckLakeConfig, pipeline_id: int, store: Store | None = None) -> None:
        self.config = config
        self._store = store
        """The pipeline's store: what it says was copied must be in the lake (``startup``)."""
        self.metrics = DuckLakeMetrics()
        """The ``etl_ducklake_*`` series; on a private registry until ``register_metrics``."""
        self.catalog = Catalog(
            config.catalog.get_secret_value(), config.data_path, pipeline_id, config.author, self.metrics
        )
        self._storage: LakeStorage | None = None
        self._options = LakeOptions({}, {}, {})
        self._spark: SparkSession | None = None
        self._spark_lock = threading.Lock()
        self._writing = Turns()
        """Held by each batch, and by upkeep, which so runs between batches."""
        self._flush_timer = FlushTimer(config.inline_flush_seconds)
        self._maintenance = Maintenance(config.maintenance, self.metrics) if config.maintenance else None
        self._copies = 0
        """Copies under way (their files are registered only at their end: not orphans)."""
        self._copies_lock = threading.Lock()
        self._upkeep: Upkeep | None = None
        self._planner: ThreadPoolExecutor | None = None
        self._warm_up: WarmUp | None = None
        """A start's read-ahead and warm-up (``warm_up``)."""
        self._pool = threading.local()
        """The fair scheduler pool a planning thread set (``spark``)."""
        self._batches = BatchCommits(
            lambda: self.lake,
            config,
            self.metrics,
            planner=lambda: self.planner,
            flush_inlined=self.flush_inlined,
            committed=self._after_commit,
        )

    @classmethod
    def from_config(cls, config: Any, context: DestinationContext) -> DuckLakeDestination:
        if not isinstance(config, DuckLakeConfig):
            config = validate(DuckLakeConfig, config, "destination", "destination")
        return cls(config, context.pipeline_id, context.store)

    @classmethod
    def preflight(cls, config: DuckLakeConfig) -> list[Check]:
        """``etl check``: the catalog reachable, the data path writable, Java there (``ducklake.preflight``)."""
        return preflight(config.catalog.get_secret_value(), config.data_path)

    @classmethod
    def deep_preflight(cls, config: DuckLakeConfig) -> list[Check]:
        """``etl check --deep``: a Spark job, and a probe written under a remote data path and removed."""
        return deep_preflight(config.data_path, config.spark, SPARK_CONF)

    @classmethod
    def recorded_position(cls, config: DuckLakeConfig, pipeline_id: int) -> DestinationPosition | None:
        """The lake's position for the pipeline (``catalog.positions``), as ``etl status`` shows it."""
        position = read_position(config.catalog.get_secret_value(), pipeline_id)
        if position is None:
            return None
        return DestinationPosition(position.lsn, f"DuckLake snapshot {position.snapshot_id}")

    def __repr__(self) -> str:
        return f"DuckLakeDestination({redacted(self.config.catalog.get_secret_value())!r}, {self.config.data_path!r})"

    # -- lifecycle -------------------------------------------------------------------------------
    def startup(self) -> None:
        if self._upkeep is not None:
            return
        require_java()
        self.catalog.open()
        try:
            self._check_lake_holds_the_copies()
            self._check_lake_is_not_behind()
            self._options = self.catalog.options()
            for schema, table, options in self._options.scopes():  # a bad value stops it here, not mid-copy
                ParquetOptions.of(options, schema, table)
        except BaseException:
            self.catalog.close()
            raise
        self._storage = LakeStorage(self.catalog.data_path, self.metrics, self.config.key_cache_bytes)
        try:  # what a transaction's parts left when the last run died
            remove_staged(self.catalog, self._storage)
        except Exception:  # the next start tries again; they are in no snapshot meanwhile
            log.warning("could not remove the files of a transaction that was not committed", exc_info=True)
        if self._store is not None:
            self._warm_up = WarmUp(self.catalog, self._storage, self._store, lambda: self.spark).start()
        for table_id in self.catalog.tables_with_inlined_rows():
            self._flush_timer.inlined(table_id)
        self._planner = ThreadPoolExecutor(self.config.planning_threads, thread_name_prefix=_PLANNER)
        every = min(UPKEEP_SECONDS, self.config.inline_flush_seconds)
        if self.config.maintenance is not None:
            every = min(every, self.config.maintenance.every_seconds)
        self._upkeep = Upkeep(self.upkeep, every, self._writing)
        self._upkeep.start()
        start_in_background(self.config.spark, SPARK_CONF)

    def _check_lake_is_not_behind(self) -> None:
        """Stop when the store's progress is past the position the lake records (``catalog.positions``): the
        catalog went back in time (restored from an older backup, say), and the changes between would be skipped.
        A lake without a recorded position (before the pipeline's first batch, or written by an earlier release)
        passes."""
        if self._store is None:
            return
        progress, lake = self._store.get_progress(APPLY_WORKER), self.catalog.position()
        if progress is None or lake is None or lake.lsn >= progress:
            return
        raise DestinationError(
            f"the DuckLake catalog {redacted(self.config.catalog.get_secret_value())} stands at {lake.lsn} of the"
            f" source's stream (snapshot {lake.snapshot_id}), behind {progress}, which this pipeline's store says it"
            " wrote into it: the catalog is older than the lake the pipeline wrote (restored from a backup, or"
            " written back), and the changes between are missing from it",
            hint="point `catalog` at the lake's latest catalog; to copy every table again into this one instead,"
            " stop the pipeline and run etl reset --recopy -c <pipeline file>",
        )

    def _check_lake_holds_the_copies(self) -> None:
        """Stop when the store says tables were copied that this lake has no record of: the catalog is not the
        one the pipeline wrote (lost, moved, or another database). Going on would stream changes into a lake
        without the copied rows, and move the store's progress past them."""
        if self._store is None:
            return
        copied = {t for t, s in self._store.get_table_states().items() if s.kind.copied}
        missing = sorted(copied - self.catalog.kept_source_tables())
        if missing:
            raise DestinationError(
                f"the DuckLake catalog {redacted(self.config.catalog.get_secret_value())} has no record of"
                f" {len(missing)} of the {len(copied)} tables this pipeline's store says were copied into it (source"
                f" table ids {', '.join(map(str, missing[:10]))}{', ...' if len(missing) > 10 else ''}): it is not"
                " the lake this pipeline wrote, or it lost them",
                hint="point `catalog` at the pipeline's lake; to copy every table again into this one instead, stop"
                " the pipeline and run etl reset --recopy -c <pipeline file>",
            )

    def shutdown(self) -> None:
        self._batches.abandon()  # the next run replays an open transaction from its start
        if self._warm_up is not None:  # it reads the catalog: done before the catalog closes
            self._warm_up.stop(self._spark)
            self._warm_up = None
        if self._upkeep is not None:
            self._upkeep.stop()
            self._upkeep = None
        if self._planner is not None:
            self._planner.shutdown()
            self._planner = None
        self.catalog.close()

    def upkeep(self) -> list[Step]:
        """The work due between batches: flush the inlined rows that have waited ``inline_flush_seconds``, and
        a round of maintenance when one is due (``maintenance``). None runs while a transaction larger than a
        batch is open: its parts were planned on the lake as it is, and wait for their commit."""
        if self._batches.open is not None:
            return []
        steps: list[Step] = [partial(self._flush_due, table_id) for table_id in self._flush_timer.due()]
        if self._maintenance is not None:
            steps += self._maintenance.due(self.lake, lambda: self._copies > 0)
        return [partial(self._unless_open, step) for step in steps]

    def _unless_open(self, step: Step) -> None:
        """Run an upkeep step in its turn, unless a batch opened a transaction since the step was found due."""
        if self._batches.open is None:
            step()

    def _flush_due(self, table_id: int) -> None:
        table = self.catalog.table(table_id)
        if table is None:
            self._flush_timer.flushed(table_id)
        else:
            self.flush_inlined(table)

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Export ``etl_ducklake_*`` on the pipeline's registry (the engine calls this once, at start)."""
        if registry is not self.metrics.registry:
            self.metrics.register(registry)

    @property
    def spark(self) -> SparkSession:
        """The Spark session, started on first use. A planning thread's jobs run in a fair pool of its own."""
        with self._spark_lock:  # planning threads, and copies, may all want it first
            if self._spark is None:
                self._spark = get_spark(self.config.spark, SPARK_CONF)
        thread = threading.current_thread().name
        if thread.startswith(_PLANNER) and getattr(self._pool, "name", None) != thread:
            self._spark.sparkContext.setLocalProperty("spark.scheduler.pool", thread)
            self._pool.name = thread
        return self._spark

    @property
    def planner(self) -> ThreadPoolExecutor:
        if self._planner is None:
            raise DestinationError(
                "the ducklake destination is not started", hint="call startup() first", transient=False
            )
        return self._planner

    @property
    def storage(self) -> LakeStorage:
        if self._storage is None:
            raise DestinationError(
                "the ducklake destination is not started", hint="call startup() first", transient=False
            )
        return self._storage

    @property
    def lake(self) -> Lake:
        """What planning works on: the catalog, the files and the Spark session (started on first use)."""
        return Lake(self.catalog, self.storage, lambda: self.spark, self.config.target_file_size_bytes, self._options)

    # -- writes ----------------------------------------------------------------------------------
    def drop_table_for_copy(self, schema: TableSchema) -> None:
        """Let the copy that follows replace the lake table: it stays readable, with its rows, until the copy's
        snapshot ends it and creates the new one (a resync without downtime)."""
        if self.catalog.tracked(schema.id):
            self.catalog.mark_for_replacement(schema.id)
            log.info("ducklake table to be replaced by its next copy", table=str(schema.name))

    def copy_table(self, plan: CopyPlan, stop: threading.Event) -> int:
        """Copy the table on Spark's executors (``copy_job``), or on the driver when it is small (``on_driver``),
        and register every file in one snapshot."""
        on, write = self._copier(plan, stop)
        with naming_table(plan.schema.id), self._copying():
            copy = plan_copy(self.lake, plan.schema, write)
            self._commit_copy(copy)
        self.metrics.copies.labels(on).inc()
        return sum(f.record_count for f in copy.files)

    def stage_chunk(self, plan: CopyPlan, watermark: tuple[Lsn, int], stop: threading.Event) -> StagedChunk:
        """An incremental copy's chunk of new keys, copied as a table is (``copy_table``) into data files no snapshot
        holds yet; ``commit_chunk`` registers them in one snapshot that moves the table's watermark to the chunk's
        place in the stream. Until then the files count as a copy's, never as orphans."""
        on, write = self._copier(plan, stop)
        position = (int(watermark[0]), watermark[1])
        copying = ExitStack()
        copying.enter_context(self._copying())
        with copying, naming_table(plan.schema.id):
            base = self.catalog.latest_snapshot()
            try:
                table_plan = plan_copy(self.lake, plan.schema, write, position)
            except FlushFirst as first:  # the table has inlined rows: into files first, then the chunk's beside them
                with self._writing.batch():
                    for table in first.tables:
                        self.flush_inlined(table)
                base = self.catalog.latest_snapshot()
                table_plan = plan_copy(self.lake, plan.schema, write, position)
            staged = _StagedFiles(sum(f.record_count for f in table_plan.files), watermark, table_plan, base, on)
            staged.copying = copying.pop_all()
        return staged

    def commit_chunk(self, staged: StagedChunk) -> int:
        chunk = _staged_files(staged)
        plan = chunk.plan
        with chunk.copying, naming_table(plan.schema.id), self._writing.batch():
            tables = [] if plan.handle is None else [plan.handle.table.table_id]
            try:
                self.catalog.commit(partial(apply_all, [plan], self.storage), base_snapshot=chunk.base, tables=tables)
            except CommitConflict as conflict:
                plan.discard(self.storage)
                raise DestinationError(
                    f"a chunk's DuckLake table was changed by another writer while the chunk was staged: {conflict}",
                    hint="none: the chunk is copied again",
                ) from None
            except BaseException:
                plan.discard(self.storage)
                raise
            plan.remember_files(self.storage)
        self.metrics.chunks.labels(chunk.on).inc()
        return chunk.rows

    def discard_chunk(self, staged: StagedChunk) -> None:
        chunk = _staged_files(staged)
        with chunk.copying:
            chunk.plan.discard(self.storage)

    def _copier(self, plan: CopyPlan, stop: threading.Event) -> tuple[str, Callable[[DataFileSpec], list[NewFile]]]:
        """Where the plan's rows are copied (``COPIED_ON``) and what writes them: on the driver when they are at
        most ``driver_copy_max_bytes``, else by Spark's tasks."""
        limit = self.config.driver_copy_max_bytes
        if limit > 0 and plan.size_bytes is not None and plan.size_bytes <= limit:
            return "driver", partial(self._copy_on_driver, plan, stop)
        return "spark", partial(self._copy_files, plan, stop)

    @contextmanager
    def _copying(self) -> Iterator[None]:
        with self._copies_lock:  # not the session's lock: a copy on the driver does not wait for Spark's start
            self._copies += 1
        try:
            yield
        finally:
            with self._copies_lock:
                self._copies -= 1

    def _copy_files(self, plan: CopyPlan, stop: threading.Event, spec: DataFileSpec) -> list[NewFile]:
        return self.storage.written(spec, partial(copy_files, self.spark, plan, spec, stop))

    def _copy_on_driver(self, plan: CopyPlan, stop: threading.Event, spec: DataFileSpec) -> list[NewFile]:
        """Read every range on one connection of this process and write the rows here: no Spark job to wait for."""
        with closing(read_ranges(plan, range(len(plan.ranges)), stop=stop)) as batches:  # its connection, too
            return self.storage.written(spec, partial(write_data_files, spec, batches))

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        """Copied rows handed over by an embedder: written as data files here, on the driver, one snapshot each.

        The engine itself hands copies over as plans (``copy_table``).
        """
        with naming_table(schema.id):
            self._commit_copy(plan_copy(self.lake, schema, partial(self.storage.write_rows, rows=rows)))
        return WriteResult.DURABLE

    def flush(self) -> None:
        """Nothing to do: every write is durable when it returns."""

    def _commit_copy(self, plan: TablePlan) -> None:
        try:
            self.catalog.commit(partial(apply_all, [plan], self.storage))
        except BaseException:
            plan.discard(self.storage)
            raise

    def write_events(self, batch: EventBatch) -> WriteResult:
        """The batch's whole transactions in one snapshot (``batch_commits``), in its turn with upkeep."""
        with self._writing.batch():
            self._batches.write(batch)
        return WriteResult.DURABLE

    def _after_commit(self, plans: list[TablePlan]) -> None:
        """Count inlined rows; flush a table's inlined rows once it holds ``inline_flush_rows``."""
        for plan in plans:
            table = plan.applied
            if plan.inline is None or table is None:  # ending inlined rows adds none
                continue
            self.metrics.inlined_rows.inc(plan.inline.num_rows)
            self._flush_timer.inlined(table.table_id)
            if self.catalog.inlined_count(table) < self.config.inline_flush_rows:
                continue
            try:
                self.flush_inlined(table)
            except Exception:  # the batch is durable; the timer tries the flush again
                log.warning("flushing inlined rows failed", table=str(plan.schema.name), exc_info=True)

    def flush_inlined(self, table: LakeTable) -> None:
        """Flush the table's inlined rows into data files."""
        rows = flush_inlined(self.lake, table, self.config.commit_attempts, self.config.driver_flush_max_rows)
        self._flush_timer.flushed(table.table_id)
        if rows:
            self.metrics.inline_flush_rows.observe(rows)

    # -- reading back ----------------------------------------------------------------------------
    def preview(self, table: TableName, limit: int) -> TablePreview:
        """The table as DuckDB reads it (``pip install 'etl-spark[duckdb]'``): row count and first rows."""
        import duckdb  # optional extra: open_lake says how to get it

        con = open_lake(self.config.catalog.get_secret_value())
        try:
            name = f"lake.{table.quoted()}"
            try:
                total = con.execute(f"SELECT count(*) FROM {name}").fetchone()
            except duckdb.CatalogException:
                raise KeyError(f"no table {table} in the lake") from None
            # Through Arrow: timestamps with time zones need no pytz.
            rows = con.execute(f"SELECT * FROM {name} ORDER BY ALL LIMIT {int(limit)}").to_arrow_table().to_pylist()
        finally:
            con.close()
        return TablePreview(int(total[0]) if total else 0, rows, f"DuckDB {duckdb.__version__}")

    # -- helpers ---------------------------------------------------------------------------------


@dataclass
class _StagedFiles(StagedChunk):
    """A chunk's data files, written but in no snapshot (``DuckLakeDestination.stage_chunk``)."""

    plan: TablePlan
    base: int
    """The lake's latest snapshot before the chunk was planned: a later one that changed its table is a conflict."""
    on: str
    """Where its rows were copied (``COPIED_ON``)."""
    copying: ExitStack = field(default_factory=ExitStack)
    """Counts it as a copy under way until it is committed or discarded (so upkeep leaves its files alone)."""


def _staged_files(staged: StagedChunk) -> _StagedFiles:
    if not isinstance(staged, _StagedFiles):
        raise TypeError(f"not a chunk this destination staged: {staged!r}")
    return staged
