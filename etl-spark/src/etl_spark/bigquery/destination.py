"""The ``bigquery`` destination: Spark stages Parquet, one load job per write fills a staging table, SQL applies it.

A table's copy, and each chunk of an incremental copy, is read from the source and staged by Spark's tasks
(``copy_job``: no copied row passes the driver), loaded by one load job, and appended to the target by one
statement (a chunk's in one transaction with the table's watermark). A batch of changes is collapsed per table
(``etl_spark.collapse``, on the driver in Arrow, or with Spark when unchanged TOAST values must be
filled: the last change per key; a key-changing update is a delete of the old key and an upsert of
the new one; a table without a key, ``REPLICA IDENTITY FULL``, is collapsed to the net number of
copies of each whole-row image), staged with every other table of the batch by one load job into a
staging table of its own (``staging``), and applied per table by one query job, a multi-statement
transaction (``BEGIN TRANSACTION; ...; COMMIT TRANSACTION;``): the truncate if any, the changes
(delete the touched keys and insert the upserts; without a key, delete the images losing copies and
insert what remains of them and the images gaining copies, so identical rows keep their
multiplicity) and the advance of the table's watermark ``(commit_lsn, tx_ordinal)`` in
``_etl_watermarks`` commit together or not at all. Changes at or below the watermark are dropped
before anything is written, so replays after a crash are idempotent. Schema changes (add, drop,
rename column; ``schema_change``, which matches columns by attribute number against the source
schema recorded per table in ``_etl_columns``) run as ``ALTER TABLE`` before the transaction
(BigQuery runs no DDL on permanent tables inside one), followed in the same script by the new
record. Applies start at most once per ``min_apply_interval_s`` per writing thread; the engine merges
what arrives meanwhile into the next batch. See docs/destinations/bigquery.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import structlog
from pydantic import BaseModel

from etl.api import (
    OP_COLUMN,
    Check,
    ColumnSchema,
    CopyPlan,
    DestinationContext,
    DestinationError,
    EventBatch,
    Lsn,
    StagedChunk,
    Store,
    TableChanges,
    TableError,
    TableSchema,
    TransientError,
    WriteResult,
    naming_table,
    validate,
)
from etl_spark.bigquery import history
from etl_spark.bigquery.config import SPARK_CONF, BigQueryConfig
from etl_spark.bigquery.copy_job import copied_rows
from etl_spark.bigquery.errors import classify
from etl_spark.bigquery.jobs import Jobs, Staged
from etl_spark.bigquery.metrics import BigQueryMetrics
from etl_spark.bigquery.names import column_name, table_id
from etl_spark.bigquery.preflight import check_holds_the_copies, deep_preflight, preflight
from etl_spark.bigquery.schema_change import alter_statements, unrecorded
from etl_spark.bigquery.staging import flatten_changes
from etl_spark.bigquery.statements import add_and_remove, append_history, converted, upsert
from etl_spark.bigquery.types import integer_key_range, staged_rows, table_ddl, table_options
from etl_spark.collapse import (
    Position,
    after,
    after_last_truncate,
    last_change_per_key_arrow,
    last_position,
    missing_columns,
    net_changes_without_key,
)
from etl_spark.copy_tasks import run_copy_job, task_ranges
from etl_spark.session import get_spark, require_java, start_in_background

if TYPE_CHECKING:
    from datetime import datetime

    from google.cloud import bigquery
    from prometheus_client import CollectorRegistry
    from pyspark.sql import DataFrame, SparkSession

log = structlog.get_logger(__name__)

WATERMARKS = "_etl_watermarks"
POSITIONS = "_etl_positions"
"""Per pipeline, the end in the source's stream of the last batch that changed a table, committed with it."""
TRANSACTION_TABLES = 90
"""Tables a batch applies in one transaction: BigQuery's transactions mutate at most 100 tables, and each also
mutates ``_etl_watermarks`` and ``_etl_positions``."""
COLUMNS = "_etl_columns"
"""Per table, the source columns (name, type, attribute number) it was last brought in line with."""
BATCH_LABEL = "*"
"""The ``table`` label of a streamed batch's load job, which carries every table of the batch."""


class BigQueryDestination:
    """Writes a pipeline's tables into one BigQuery dataset (see the module docstring)."""

    name: ClassVar[str] = "bigquery"
    Config: ClassVar[type[BaseModel]] = BigQueryConfig

    def __init__(self, config: BigQueryConfig, pipeline_id: int, store: Store | None = None) -> None:
        self.config = config
        self.pipeline_id = pipeline_id
        self._store = store
        """The pipeline's store: at start, the tables it says were copied must be in the dataset."""
        self._spark: SparkSession | None = None
        self._applied: dict[int, TableSchema] = {}
        """Per table, the schema its BigQuery table is in line with (as recorded in ``_etl_columns``)."""
        self._watermarks: dict[int, Position] = {}
        """Per table, its watermark as last read or committed (this destination is the table's one writer)."""
        self.metrics = BigQueryMetrics()
        """The ``etl_bigquery_*`` series; on a private registry until ``register_metrics``."""
        self.jobs = Jobs(config, pipeline_id, self.metrics, lambda: self.spark)
        self.min_write_interval_s = config.min_apply_interval_s
        """The engine hands each writer's batches over at most this often, unless full (``Paced``)."""
        self._metadata = threading.Lock()
        """Held by transactions that write ``_etl_watermarks`` or ``_etl_columns``: BigQuery aborts one of two
        concurrent transactions mutating the same table, and writers (the apply worker, table copies and
        catch-ups) run on several threads. So they apply one at a time, each for its whole query job."""

    @classmethod
    def from_config(cls, config: Any, context: DestinationContext) -> BigQueryDestination:
        if not isinstance(config, BigQueryConfig):
            config = validate(BigQueryConfig, config, "destination", "destination")
        return cls(config, context.pipeline_id, context.store)

    @classmethod
    def preflight(cls, config: BigQueryConfig) -> list[Check]:
        """``etl check``: the dataset, a local staging directory, and Java for the Spark session."""
        return preflight(config)

    @classmethod
    def deep_preflight(cls, config: BigQueryConfig) -> list[Check]:
        """``etl check --deep``: the Spark session runs a job, and writes into the staging location and removes it."""
        return deep_preflight(config, SPARK_CONF)

    def __repr__(self) -> str:
        return f"BigQueryDestination({self.config.project}.{self.config.dataset})"

    # -- lifecycle -------------------------------------------------------------------------------
    def startup(self) -> None:
        from google.api_core import exceptions
        from google.cloud import bigquery

        require_java()
        self.jobs.open()
        dataset = bigquery.Dataset(f"{self.config.project}.{self.config.dataset}")
        dataset.location = self.config.location
        try:
            try:  # a dataset that exists needs no bigquery.datasets.create permission
                self.client.get_dataset(dataset.reference)
            except exceptions.NotFound:
                self.client.create_dataset(dataset, exists_ok=True)
            self.jobs.query(
                f"CREATE TABLE IF NOT EXISTS {self.jobs.ref(WATERMARKS)} (pipeline_id INT64, table_oid INT64,"
                f" commit_lsn INT64, tx_ordinal INT64);\nCREATE TABLE IF NOT EXISTS {self.jobs.ref(POSITIONS)}"
                " (pipeline_id INT64, commit_lsn INT64, lsn STRING, applied_at TIMESTAMP);"
                f"\nCREATE TABLE IF NOT EXISTS {self.jobs.ref(COLUMNS)}"
                " (table_name STRING, position INT64, column_name STRING, type_oid INT64, type_modifier INT64,"
                " attnum INT64);"
            )
            tables = {t.table_id for t in self.client.list_tables(dataset.reference, retry=self.jobs.retry)}
            self.jobs.drop_leftover_staging(tables)
        except exceptions.GoogleAPICallError as exc:
            passing = classify(exc, "opening the dataset")
            if isinstance(passing, TransientError):
                raise passing from None
            raise DestinationError(
                f"BigQuery dataset {self.config.project}.{self.config.dataset} is not usable: {exc.message}",
                hint="check the project, dataset, location and that the credentials may create tables and run jobs",
            ) from None
        check_holds_the_copies(self.config, self._store, tables)
        start_in_background(self.config.spark, SPARK_CONF)

    def shutdown(self) -> None:
        self.jobs.close()

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Export ``etl_bigquery_*`` on the pipeline's registry (the engine calls this once, at start)."""
        if registry is not self.metrics.registry:
            self.metrics.register(registry)

    @property
    def client(self) -> bigquery.Client:
        return self.jobs.client

    @property
    def spark(self) -> SparkSession:
        if self._spark is None:
            self._spark = get_spark(self.config.spark, SPARK_CONF)
        return self._spark

    # -- writes ----------------------------------------------------------------------------------
    def drop_table_for_copy(self, schema: TableSchema) -> None:
        self._applied.pop(schema.id, None)
        self._watermarks.pop(schema.id, None)
        with self._metadata:
            self.jobs.query(
                f"DROP TABLE IF EXISTS {self.jobs.ref(table_id(schema.name))};\n"
                f"DELETE FROM {self.jobs.ref(WATERMARKS)} WHERE {self._watermark_row(schema)};\n"
                f"DELETE FROM {self.jobs.ref(COLUMNS)} WHERE {self._columns_row(schema)};"
            )

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        target = self._prepare(schema)
        if rows.num_rows:
            frame = self.spark.createDataFrame(staged_rows(schema, rows, changes=False))
            with self.jobs.staging([frame], rows.nbytes, str(schema.name)) as staged:
                self.jobs.dml(self._append_copied(schema, target, staged.sources[0]), schema)
            self.metrics.copied_rows.labels("driver").inc(rows.num_rows)
        return WriteResult.DURABLE

    def copy_table(self, plan: CopyPlan, stop: threading.Event) -> int:
        """Copy the table by Spark's tasks (``copy_job``): one load job of all its rows into a staging table, one
        statement appending them to the target table, created anew. No copied row passes the driver, and none is
        visible before all are."""
        schema = plan.schema
        with naming_table(schema.id):
            target = self._prepare(schema)
            if not plan.ranges:
                return 0
            with self._copied(plan, stop) as staged:
                if staged.rows:
                    self.jobs.dml(self._append_copied(schema, target, staged.sources[0]), schema)
        self.metrics.copied_rows.labels("spark").inc(staged.rows)
        return staged.rows

    def stage_chunk(self, plan: CopyPlan, watermark: tuple[Lsn, int], stop: threading.Event) -> StagedChunk:
        """An incremental copy's chunk of new keys, read and loaded into a staging table as a table's copy is
        (``copy_table``); ``commit_chunk`` appends it in one transaction that moves the table's watermark to the
        chunk's place in the stream."""
        with naming_table(plan.schema.id), ExitStack() as stack:
            staged = stack.enter_context(self._copied(plan, stop))
            return _StagedLoad(staged.rows, watermark, plan.schema, staged, stack.pop_all())

    def commit_chunk(self, staged: StagedChunk) -> int:
        chunk = _staged_load(staged)
        schema, position = chunk.schema, (int(chunk.watermark[0]), chunk.watermark[1])
        with chunk.dropping, naming_table(schema.id):
            target = self._prepare(schema)
            append = [self._append_copied(schema, target, chunk.staged.sources[0])] if chunk.rows else []
            statements = ["BEGIN TRANSACTION", *append, *self._advance(schema, position), "COMMIT TRANSACTION"]
            self._watermarks.pop(schema.id, None)  # unknown should the job fail
            with self._metadata:
                self.jobs.dml(";\n".join(statements) + ";", schema)
            self._watermarks[schema.id] = position
        self.metrics.copied_rows.labels("spark").inc(chunk.rows)
        return chunk.rows

    def discard_chunk(self, staged: StagedChunk) -> None:
        _staged_load(staged).dropping.close()

    @contextmanager
    def _copied(self, plan: CopyPlan, stop: threading.Event) -> Iterator[Staged]:
        """The plan's rows, read and staged by a Spark job (stopped when ``stop`` is set) and loaded into a staging
        table by one load job."""
        ranges = task_ranges(self.spark, plan)
        frame, counted = copied_rows(self.spark, ranges)

        def run(write: Callable[[], None]) -> int:
            run_copy_job(self.spark, ranges, stop, write)
            return int(counted.value)

        with self.jobs.staging([frame], plan.size_bytes or 0, str(plan.schema.name), run=run) as staged:
            yield staged

    def _append_copied(self, schema: TableSchema, target: str, staged: str) -> str:
        """The statement appending copied rows from ``staged`` to ``target`` (in history mode as ``copy`` rows,
        with no position and no commit time)."""
        names = [column_name(c.name) for c in schema.columns]
        values = converted(schema)
        if self.config.mode == "history":
            names += [name for name, _ in history.COLUMNS]
            values += f", '{history.COPY}', NULL, NULL, NULL"
        return f"INSERT INTO {target} ({', '.join(names)}) SELECT {values} FROM {staged} AS S"

    def write_events(self, batch: EventBatch) -> WriteResult:
        """Apply the batch: one load job for all its tables, then one transaction for all of them (of up to
        ``TRANSACTION_TABLES`` tables each), which also records the batch's end in ``_etl_positions``.

        A table whose schema changed inside the batch has several segments; they are applied in rounds
        (the first segment of every table, then the second, ...), each round with its own load.
        """
        rounds = max((len(segments) for segments in batch.changes.values()), default=0)
        for k in range(rounds):
            segments = [segments[k] for segments in batch.changes.values() if len(segments) > k]
            self._apply(segments, batch.commit_timestamps, (batch.last_commit_lsn or None) if k == rounds - 1 else None)
        return WriteResult.DURABLE

    def flush(self) -> None:
        """Every write is durable when it returns."""

    # -- change batches --------------------------------------------------------------------------
    def _apply(
        self, segments: list[TableChanges], commit_timestamps: Mapping[int, datetime], position: Lsn | None
    ) -> None:
        """Collapse each table's changes (one segment of each), stage them all with one load, then apply them
        together (``_commit_together``), recording ``position`` with the last of them."""
        collapsed: list[_Collapsed] = []
        for segment in segments:
            with naming_table(segment.schema.id):
                change = self._collapse(segment, commit_timestamps)
            if change is not None:
                collapsed.append(change)
        frames = [c.frame for c in collapsed if c.frame is not None]
        with self.jobs.staging(frames, sum(c.nbytes for c in collapsed), BATCH_LABEL) as staged:
            sources = iter(staged.sources)
            placed = [(change, next(sources) if change.frame is not None else None) for change in collapsed]
            for start in range(0, len(placed), TRANSACTION_TABLES):
                group = placed[start : start + TRANSACTION_TABLES]
                last = start + TRANSACTION_TABLES >= len(placed)
                self._commit_together(group, position if last else None)

    def _commit_together(self, group: list[tuple[_Collapsed, str | None]], position: Lsn | None) -> None:
        """One transaction for the tables of ``group``: each one's truncate, its changes read from its staged
        rows, its watermark, and ``position`` as the pipeline's. BigQuery's error for a statement of a transaction
        names no table: when it rejects one, the tables apply one transaction each, and the one at fault errors
        alone."""
        if not group:
            return
        statements = ["BEGIN TRANSACTION"]
        for change, staged in group:
            with naming_table(change.schema.id):
                statements += self._statements(change, staged)
        if position is not None:
            statements += self._stands_at(position)
        statements.append("COMMIT TRANSACTION")
        for change, _ in group:
            self._watermarks.pop(change.schema.id, None)  # unknown should the job fail
        try:
            with self._metadata:
                self.jobs.dml(";\n".join(statements) + ";", group[0][0].schema)
        except TableError:
            if len(group) == 1:
                raise
            for change, staged in group:  # rolled back: each alone, so that the error names its table
                self._commit_together([(change, staged)], None)
            if position is not None:
                with self._metadata:
                    self.jobs.query(";\n".join(["BEGIN TRANSACTION", *self._stands_at(position), "COMMIT TRANSACTION"]))
            return
        for change, _ in group:
            self._watermarks[change.schema.id] = change.position

    def _collapse(self, segment: TableChanges, commit_timestamps: Mapping[int, datetime]) -> _Collapsed | None:
        """The segment's changes past the table's watermark, collapsed (in history mode: every one of them, as
        history rows); ``None`` when all are replays."""
        schema = segment.schema
        changes = after(segment.table, self._watermark(schema))
        position = last_position(changes)
        if position is None:
            return None  # a replay: the table may already have a later shape, leave it
        if self.config.mode == "history":
            changes = history.with_key_change_deletes(changes, schema)
            rows = history.with_history(staged_rows(schema, changes, changes=False), changes, commit_timestamps)
            return _Collapsed(
                schema, position, False, self.spark.createDataFrame(rows), changes.nbytes, [], False, None
            )
        truncate, changes = after_last_truncate(changes)
        key = [c.name for c in schema.key_columns]
        names = schema.column_names
        frame: DataFrame | None = None
        toast: list[str] = []
        removes = False
        key_range: tuple[int, int] | None = None
        if changes.num_rows and key:
            toast = missing_columns(changes)
            table = staged_rows(schema, changes, changes=True)
            collapsed = last_change_per_key_arrow(table, names, key, toast)  # on the driver: no Spark job
            if toast:
                frame = flatten_changes(self.spark.createDataFrame(collapsed), key)
            else:
                key_range = integer_key_range(schema, collapsed)
                frame = self.spark.createDataFrame(collapsed)
        elif changes.num_rows:
            frame = net_changes_without_key(
                self.spark.createDataFrame(staged_rows(schema, changes, changes=True)), names
            )
            removes = not pc.all(pc.equal(changes[OP_COLUMN], "I")).as_py()
        return _Collapsed(schema, position, truncate, frame, changes.nbytes, toast, removes, key_range)

    def _statements(self, change: _Collapsed, staged: str | None) -> list[str]:
        """The table's truncate, its changes read from ``staged``, its watermark (its target table created or
        altered first: BigQuery runs no DDL in a transaction)."""
        schema = change.schema
        target = self._prepare(schema)
        statements = []
        if change.truncate:
            statements.append(f"DELETE FROM {target} WHERE TRUE")
        if staged is not None and self.config.mode == "history":
            statements.append(append_history(schema, target, staged))
        elif staged is not None and schema.key_columns:
            statements += upsert(schema, target, staged, change.toast, change.key_range)
        elif staged is not None:
            statements += add_and_remove(schema, target, staged, change.removes)
        return [*statements, *self._advance(schema, change.position)]

    def _stands_at(self, position: Lsn) -> list[str]:
        """Record ``position`` (a batch's end in the source's stream) as where the dataset stands."""
        return [
            f"DELETE FROM {self.jobs.ref(POSITIONS)} WHERE pipeline_id = {int(self.pipeline_id)}",
            f"INSERT INTO {self.jobs.ref(POSITIONS)} (pipeline_id, commit_lsn, lsn, applied_at)"
            f" VALUES ({int(self.pipeline_id)}, {int(position)}, '{position}', CURRENT_TIMESTAMP())",
        ]

    def _advance(self, schema: TableSchema, position: Position) -> list[str]:
        lsn, ordinal = position
        return [
            f"DELETE FROM {self.jobs.ref(WATERMARKS)} WHERE {self._watermark_row(schema)}",
            f"INSERT INTO {self.jobs.ref(WATERMARKS)} (pipeline_id, table_oid, commit_lsn, tx_ordinal)"
            f" VALUES ({int(self.pipeline_id)}, {int(schema.id)}, {int(lsn)}, {int(ordinal)})",
        ]

    def _watermark(self, schema: TableSchema) -> Position:
        if schema.id not in self._watermarks:
            sql = f"SELECT commit_lsn, tx_ordinal FROM {self.jobs.ref(WATERMARKS)} WHERE {self._watermark_row(schema)}"
            rows = list(self.jobs.query(sql))
            self._watermarks[schema.id] = (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)
        return self._watermarks[schema.id]

    def _watermark_row(self, schema: TableSchema) -> str:
        return f"pipeline_id = {int(self.pipeline_id)} AND table_oid = {int(schema.id)}"

    # -- table shape -----------------------------------------------------------------------------
    def _prepare(self, schema: TableSchema) -> str:
        """The target table, created or altered to match ``schema``, which is then recorded as applied."""
        target = self.jobs.ref(table_id(schema.name))
        applied = self._applied.get(schema.id)
        if applied is None:
            applied = self._recorded(schema)
            if applied is not None:
                self._check_mode(schema)
        if applied is not None and _shape(applied) == _shape(schema):
            self._applied[schema.id] = schema
            return target
        historic = self.config.mode == "history"
        if applied is None:
            options = table_options(schema, self.config.partition_by.get(str(schema.name)))
            columns = (
                f"{table_ddl(schema, primary_key=False)}, {history.history_ddl()}" if historic else table_ddl(schema)
            )
            self.jobs.query(f"CREATE TABLE IF NOT EXISTS {target} ({columns}) {options}", schema)
        table = self.client.get_table(self.jobs.path(table_id(schema.name)))
        own = history.own_columns([f.name for f in table.schema]) if historic else frozenset()
        alteration = alter_statements(
            table, applied or unrecorded(table, schema, own), schema, own, keep_dropped=historic
        )
        # BigQuery runs DDL outside transactions only: the record follows the ALTERs in the same script, and
        # the added columns' fill (not in history mode: older changes did not carry them) commits with it.
        fill = [] if historic else alteration.fill(schema, target)
        with self._metadata:
            self.jobs.query(
                ";\n".join([*(f"ALTER TABLE {target} {a}" for a in alteration.actions), *self._record(schema, fill)])
                + ";",
                schema,
            )
        self._applied[schema.id] = schema
        return target

    def _check_mode(self, schema: TableSchema) -> None:
        """A table written in the other ``mode`` errors (its rows mean something else)."""
        table = self.client.get_table(self.jobs.path(table_id(schema.name)), retry=self.jobs.retry)
        historic = history.is_history_table([f.name for f in table.schema])
        if historic != (self.config.mode == "history"):
            raise TableError(
                f"{schema.name}: its BigQuery table was written in {'history' if historic else 'apply'} mode, and the"
                f" destination now runs in {self.config.mode} mode",
                hint="resync the table (etl resync) to rebuild it in this mode, or set the destination's mode back",
                table_id=schema.id,
            )

    def _recorded(self, schema: TableSchema) -> TableSchema | None:
        rows = self.jobs.query(
            f"SELECT column_name, type_oid, type_modifier, attnum FROM {self.jobs.ref(COLUMNS)}"
            f" WHERE {self._columns_row(schema)} ORDER BY position"
        )
        columns = tuple(ColumnSchema(r[0], int(r[1]), int(r[2]), attnum=r[3]) for r in rows)
        return TableSchema(schema.id, schema.name, columns) if columns else None

    def _record(self, schema: TableSchema, also: list[str]) -> list[str]:
        """A transaction recording ``schema`` as applied, running the statements ``also`` too."""
        values = ", ".join(
            f"('{table_id(schema.name)}', {i}, '{c.name}', {int(c.type_oid)}, {int(c.type_modifier)},"
            f" {'NULL' if c.attnum is None else int(c.attnum)})"
            for i, c in enumerate(schema.columns)
        )
        return [
            "BEGIN TRANSACTION",
            f"DELETE FROM {self.jobs.ref(COLUMNS)} WHERE {self._columns_row(schema)}",
            f"INSERT INTO {self.jobs.ref(COLUMNS)} (table_name, position, column_name, type_oid, type_modifier, attnum)"
            f" VALUES {values}",
            *also,
            "COMMIT TRANSACTION",
        ]

    def _columns_row(self, schema: TableSchema) -> str:
        return f"table_name = '{table_id(schema.name)}'"


@dataclass(frozen=True)
class _Collapsed:
    """One table's changes of a batch segment, collapsed and ready to stage (``frame``, if any) and apply."""

    schema: TableSchema
    position: Position
    """The last change's position: the table's watermark once applied."""
    truncate: bool
    """A truncate comes first (``frame`` holds only what followed the last one)."""
    frame: DataFrame | None
    nbytes: int
    toast: list[str]
    """Columns with unchanged TOAST values to fill from the stored rows (tables with a key)."""
    removes: bool
    """Rows lose copies (tables without a key): the stored table must be read."""
    key_range: tuple[int, int] | None
    """The least and greatest value of the first key column the changes touch, when it is an integer."""


def _shape(schema: TableSchema) -> list[tuple[str, int, int, int | None]]:
    return [(c.name, c.type_oid, c.type_modifier, c.attnum) for c in schema.columns]


@dataclass
class _StagedLoad(StagedChunk):
    """A chunk's rows in a staging table (``BigQueryDestination.stage_chunk``)."""

    schema: TableSchema
    staged: Staged
    dropping: ExitStack
    """Drops the staging table once the chunk is appended, or discarded."""


def _staged_load(staged: StagedChunk) -> _StagedLoad:
    if not isinstance(staged, _StagedLoad):
        raise TypeError(f"not a chunk this destination staged: {staged!r}")
    return staged
