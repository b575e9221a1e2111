"""The ``bigquery`` destination: Spark stages Parquet, one load job per write fills a staging table, SQL applies it.

A copy chunk is staged and appended to the target. A batch of changes is collapsed per table
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
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from etl.api import (
    COMMIT_LSN_COLUMN,
    OLD_COLUMN,
    OP_COLUMN,
    TX_ORDINAL_COLUMN,
    Check,
    ColumnSchema,
    DestinationContext,
    DestinationError,
    EtlError,
    EventBatch,
    Integer,
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
from etl_spark.bigquery.client import make_client
from etl_spark.bigquery.errors import classify, passes
from etl_spark.bigquery.metrics import BigQueryMetrics
from etl_spark.bigquery.names import column_name, table_id
from etl_spark.bigquery.preflight import deep_preflight, preflight
from etl_spark.bigquery.schema_change import alter_statements, unrecorded
from etl_spark.bigquery.staging import groups, side_by_side, source, table_prefix
from etl_spark.bigquery.types import bq_type, check_columns, staged, table_ddl, table_options
from etl_spark.collapse import (
    ACTION,
    NET,
    PRIOR_KEY,
    UPSERT,
    Position,
    after,
    after_last_truncate,
    last_change_per_key,
    last_change_per_key_arrow,
    last_position,
    missing_columns,
    net_changes_without_key,
)
from etl_spark.session import SparkSettings, delete_path, get_spark, require_java, start_in_background

if TYPE_CHECKING:
    from datetime import datetime

    from google.cloud import bigquery
    from prometheus_client import CollectorRegistry
    from pyspark.sql import DataFrame, SparkSession

log = structlog.get_logger(__name__)

WATERMARKS = "_etl_watermarks"
COLUMNS = "_etl_columns"
"""Per table, the source columns (name, type, attribute number) it was last brought in line with."""
CHANGES = "_etl_changes"
STORED = "_etl_stored"
"""For tables without a key, the temporary table counting the stored occurrences of row images losing copies."""
"""The temporary table holding a batch's collapsed changes in target types, inside the apply transaction."""
MISSING_TEXT = "_etl_missing_text"
"""Unchanged TOAST column names as ``,a,b,`` (staged without Parquet lists)."""
BATCH_LABEL = "*"
"""The ``table`` label of a streamed batch's load job, which carries every table of the batch."""
SPARK_CONF = {"spark.sql.parquet.compression.codec": "zstd"}


class BigQueryConfig(BaseModel):
    """``[destination]`` keys of ``type = "bigquery"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str = Field(
        min_length=1,
        description="Google Cloud project of the dataset; load and query jobs run (and are billed) here.",
    )
    dataset: str = Field(
        pattern=r"^[A-Za-z0-9_]{1,1024}$",
        json_schema_extra={"form": "letters, digits and _ only, at most 1,024 of them"},
        examples=["analytics"],
        description="Dataset id (letters, digits, `_`); created at startup when missing, in `location`.",
    )
    location: str = Field("US", min_length=1, description="Location of the dataset and of every job.")
    credentials_file: str | None = Field(
        None,
        description="A service-account JSON key. Without it: application default credentials"
        " (`GOOGLE_APPLICATION_CREDENTIALS`, `gcloud auth application-default login`, or the attached service"
        " account on GCE/GKE/Cloud Run). An unreadable key is a config error that names the file, never its content.",
    )
    staging_uri: str = Field(description="`gs://bucket[/prefix]` where batches are staged as Parquet for load jobs.")
    staging_local_dir: str | None = Field(
        None,
        description="A local directory that *is* the staging bucket (a local emulator serves it as `gs://bucket`);"
        " Spark writes there instead of `staging_uri`.",
    )
    endpoint: str | None = Field(
        None,
        description="BigQuery API endpoint override, for a local emulator; with it and no `credentials_file`,"
        " requests are sent without credentials.",
    )
    partition_by: dict[str, str] = Field(
        default_factory=dict,
        description='Per source table (`"schema.table"`), a date or timestamp column its target table is partitioned'
        " by, by day; applied when the target table is created.",
    )
    mode: Literal["apply", "history"] = Field(
        "apply",
        description='`"apply"`: each target table mirrors its source table. `"history"`: every change is appended as'
        " a row, deletes kept (see [History mode](#history-mode)).",
    )
    min_apply_interval_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="At least this long between the starts of two batch applies of one writer (the apply worker, a"
        " table's catch-up), unless the batch is full (`[batch] busy_max_bytes`). The engine merges what arrives"
        " meanwhile into the next batch, so each table gets at most one DML transaction, and the pipeline one load"
        " job, per interval; it is also about the latency (a change waits up to the interval). `0` applies every"
        " batch as it comes. See [Quotas](#quotas).",
    )
    api_retry_seconds: Integer = Field(
        120,
        ge=1,
        description="How long the BigQuery client retries a failing call itself (429, 5xx, dropped connections);"
        " after that the failure goes to the engine, which retries the batch with backoff.",
    )
    spark: SparkSettings = Field(
        default_factory=SparkSettings,
        description="The section `[destination.spark]`: the Spark session, shared with the `ducklake` destination"
        " (see [ducklake.md](ducklake.md#config-keys)); its keys follow.",
    )

    @field_validator("staging_uri")
    @classmethod
    def _staging(cls, value: str) -> str:
        if not value.startswith("gs://") or len(value) <= len("gs://"):
            raise ValueError("staging_uri must be gs://bucket[/prefix]")
        return value.rstrip("/")


class BigQueryDestination:
    """Writes a pipeline's tables into one BigQuery dataset (see the module docstring)."""

    name: ClassVar[str] = "bigquery"
    Config: ClassVar[type[BaseModel]] = BigQueryConfig

    def __init__(self, config: BigQueryConfig, pipeline_id: int, store: Store | None = None) -> None:
        self.config = config
        self.pipeline_id = pipeline_id
        self._store = store
        """The pipeline's store: at start, the tables it says were copied must be in the dataset."""
        self._client: bigquery.Client | None = None
        self._spark: SparkSession | None = None
        self._applied: dict[int, TableSchema] = {}
        """Per table, the schema its BigQuery table is in line with (as recorded in ``_etl_columns``)."""
        self._watermarks: dict[int, Position] = {}
        """Per table, its watermark as last read or committed (this destination is the table's one writer)."""
        self.metrics = BigQueryMetrics()
        """The ``etl_bigquery_*`` series; on a private registry until ``register_metrics``."""
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
        self._client = make_client(self.config)
        dataset = bigquery.Dataset(f"{self.config.project}.{self.config.dataset}")
        dataset.location = self.config.location
        try:
            try:  # a dataset that exists needs no bigquery.datasets.create permission
                self.client.get_dataset(dataset.reference)
            except exceptions.NotFound:
                self.client.create_dataset(dataset, exists_ok=True)
            self._query(
                f"CREATE TABLE IF NOT EXISTS {self._ref(WATERMARKS)} (pipeline_id INT64, table_oid INT64,"
                f" commit_lsn INT64, tx_ordinal INT64);\nCREATE TABLE IF NOT EXISTS {self._ref(COLUMNS)}"
                " (table_name STRING, position INT64, column_name STRING, type_oid INT64, type_modifier INT64,"
                " attnum INT64);"
            )
            tables = {t.table_id for t in self.client.list_tables(dataset.reference, retry=self._retry)}
            self._drop_leftover_staging(tables)
        except exceptions.GoogleAPICallError as exc:
            passing = classify(exc, "opening the dataset")
            if isinstance(passing, TransientError):
                raise passing from None
            raise DestinationError(
                f"BigQuery dataset {self.config.project}.{self.config.dataset} is not usable: {exc.message}",
                hint="check the project, dataset, location and that the credentials may create tables and run jobs",
            ) from None
        self._check_dataset_holds_the_copies(tables)
        start_in_background(self.config.spark, SPARK_CONF)

    def _check_dataset_holds_the_copies(self, tables: set[str]) -> None:
        """Stop when the store says tables were copied that the dataset does not have: it was deleted, or it is
        another dataset. Going on would create them empty, stream changes into them, and move the store's progress
        past the copied rows."""
        if self._store is None:
            return
        copied = {t for t, s in self._store.get_table_states().items() if s.kind.copied}
        names: dict[int, set[str]] = {}
        for schema in self._store.get_table_schemas():  # every name a table had: a renamed one may keep its old
            if schema.id in copied:
                try:
                    names.setdefault(schema.id, set()).add(table_id(schema.name))
                except TableError:  # a name BigQuery refuses errors its table at its write, not the whole start
                    continue
        missing = sorted(t for t in copied if t in names and not names[t] & tables)
        if missing:
            shown = ", ".join(sorted(min(names[t]) for t in missing[:10]))
            raise DestinationError(
                f"BigQuery dataset {self.config.project}.{self.config.dataset} has no table for {len(missing)} of the"
                f" {len(copied)} tables this pipeline's store says were copied into it ({shown}"
                f"{', ...' if len(missing) > 10 else ''}): it was deleted or emptied, or it is not the pipeline's",
                hint="point `dataset` at the pipeline's dataset; to copy every table again into this one instead, stop"
                " the pipeline and run etl reset --recopy -c <pipeline file>",
            )

    def shutdown(self) -> None:
        if self._client is not None:
            self._client.close()  # type: ignore[no-untyped-call]
            self._client = None

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """Export ``etl_bigquery_*`` on the pipeline's registry (the engine calls this once, at start)."""
        if registry is not self.metrics.registry:
            self.metrics.register(registry)

    @property
    def _retry(self) -> Any:
        """The client's retry of one API call, bounded by ``api_retry_seconds``."""
        from google.cloud.bigquery.retry import DEFAULT_RETRY

        return DEFAULT_RETRY.with_timeout(self.config.api_retry_seconds)

    @property
    def _job_retry(self) -> Any:
        """The client's retry of a failed query job, bounded by ``api_retry_seconds``."""
        from google.cloud.bigquery.retry import DEFAULT_JOB_RETRY

        return DEFAULT_JOB_RETRY.with_timeout(self.config.api_retry_seconds)

    @property
    def client(self) -> bigquery.Client:
        if self._client is None:
            raise DestinationError(
                "the bigquery destination is not started", hint="call startup() first", transient=False
            )
        return self._client

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
            self._query(
                f"DROP TABLE IF EXISTS {self._ref(table_id(schema.name))};\n"
                f"DELETE FROM {self._ref(WATERMARKS)} WHERE {self._watermark_row(schema)};\n"
                f"DELETE FROM {self._ref(COLUMNS)} WHERE {self._columns_row(schema)};"
            )

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        target = self._prepare(schema)
        if rows.num_rows:
            frame = self.spark.createDataFrame(self._staged(schema, rows, changes=False))
            with self._staging([frame], rows.nbytes, str(schema.name)) as [staged]:
                names = [column_name(c.name) for c in schema.columns]
                values = self._converted(schema)
                if self.config.mode == "history":  # copied rows: no position, no commit time
                    names += [name for name, _ in history.COLUMNS]
                    values += f", '{history.COPY}', NULL, NULL, NULL"
                self._dml(f"INSERT INTO {target} ({', '.join(names)}) SELECT {values} FROM {staged} AS S", schema)
        return WriteResult.DURABLE

    def write_events(self, batch: EventBatch) -> WriteResult:
        """Apply the batch: one load job for all its tables, then one transaction per table.

        A table whose schema changed inside the batch has several segments; they are applied in rounds
        (the first segment of every table, then the second, ...), each round with its own load.
        """
        rounds = max((len(segments) for segments in batch.changes.values()), default=0)
        for k in range(rounds):
            segments = [segments[k] for segments in batch.changes.values() if len(segments) > k]
            self._apply(segments, batch.commit_timestamps)
        return WriteResult.DURABLE

    def flush(self) -> None:
        """Every write is durable when it returns."""

    # -- change batches --------------------------------------------------------------------------
    def _apply(self, segments: list[TableChanges], commit_timestamps: Mapping[int, datetime]) -> None:
        """Collapse each table's changes, stage them all with one load, then apply them table by table."""
        collapsed: list[_Collapsed] = []
        for segment in segments:
            with naming_table(segment.schema.id):
                change = self._collapse(segment, commit_timestamps)
            if change is not None:
                collapsed.append(change)
        frames = [c.frame for c in collapsed if c.frame is not None]
        with self._staging(frames, sum(c.nbytes for c in collapsed), BATCH_LABEL) as staged:
            sources = iter(staged)
            for change in collapsed:
                with naming_table(change.schema.id):
                    self._commit(change, next(sources) if change.frame is not None else None)

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
            rows = history.with_history(self._staged(schema, changes, changes=False), changes, commit_timestamps)
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
            table = self._staged(schema, changes, changes=True)
            if toast:
                frame = self._flatten(last_change_per_key(self.spark.createDataFrame(table), names, key, toast), key)
            else:  # the common case, collapsed on the driver in Arrow: no Spark job
                collapsed = last_change_per_key_arrow(table, names, key)
                key_range = _integer_range(schema, collapsed)
                frame = self.spark.createDataFrame(collapsed)
        elif changes.num_rows:
            frame = net_changes_without_key(
                self.spark.createDataFrame(self._staged(schema, changes, changes=True)), names
            )
            removes = not pc.all(pc.equal(changes[OP_COLUMN], "I")).as_py()
        return _Collapsed(schema, position, truncate, frame, changes.nbytes, toast, removes, key_range)

    def _commit(self, change: _Collapsed, staged: str | None) -> None:
        """One transaction: the table's truncate, its changes read from ``staged``, its watermark."""
        schema = change.schema
        target = self._prepare(schema)
        statements = ["BEGIN TRANSACTION"]
        if change.truncate:
            statements.append(f"DELETE FROM {target} WHERE TRUE")
        if staged is not None and self.config.mode == "history":
            statements.append(self._append_history(schema, target, staged))
        elif staged is not None and schema.key_columns:
            statements += self._upsert(schema, target, staged, change.toast, change.key_range)
        elif staged is not None:
            statements += self._add_and_remove(schema, target, staged, change.removes)
        statements += [*self._advance(schema, change.position), "COMMIT TRANSACTION"]
        self._watermarks.pop(schema.id, None)  # unknown should the job fail
        with self._metadata:
            self._dml(";\n".join(statements) + ";", schema)
        self._watermarks[schema.id] = change.position

    def _upsert(
        self, schema: TableSchema, target: str, staging: str, toast: list[str], key_range: tuple[int, int] | None
    ) -> list[str]:
        """Statements applying the collapsed changes in ``staging``: the keys they touch are deleted, upserts inserted.

        Not a MERGE: local-bigquery runs a MERGE inside its own DuckDB transaction, which cannot nest in
        the script's (the emulator then aborts the whole script), while DELETE and INSERT work in both.
        The changes are first converted into a temporary table, so unchanged TOAST values are read
        from the stored rows before those rows are deleted.
        """
        key = [column_name(c.name) for c in schema.key_columns]
        names = [column_name(c.name) for c in schema.columns]
        source = f"SELECT {self._converted(schema)}, S.{ACTION} FROM {staging} AS S"
        if toast:
            # Unchanged TOAST values still missing come from the stored row of the prior key.
            prior = " AND ".join(f"P.{k} = S.`_etl_prior_{k.strip('`')}`" for k in key)
            fills = {column_name(t): t for t in toast}
            values = [
                f"IF(STRPOS(S.{MISSING_TEXT}, ',{fills[n]},') > 0, P.{n}, {self._conversion(schema, n)}) AS {n}"
                if n in fills
                else f"{self._conversion(schema, n)} AS {n}"
                for n in names
            ]
            source = f"SELECT {', '.join(values)}, S.{ACTION} FROM {staging} AS S LEFT JOIN {target} AS P ON {prior}"
        touched = " AND ".join(f"U.{k} = T.{k}" for k in key)
        # A constant range of the first key column lets BigQuery skip the blocks of a table clustered by it.
        bounded = f"T.{key[0]} BETWEEN {key_range[0]} AND {key_range[1]} AND " if key_range else ""
        return [
            f"CREATE TEMP TABLE {CHANGES} AS {source}",
            f"DELETE FROM {target} AS T WHERE {bounded}EXISTS (SELECT 1 FROM {CHANGES} AS U WHERE {touched})",
            f"INSERT INTO {target} ({', '.join(names)}) SELECT {', '.join(names)} FROM {CHANGES}"
            f" WHERE {ACTION} = '{UPSERT}'",
            f"DROP TABLE {CHANGES}",
        ]

    def _append_history(self, schema: TableSchema, target: str, staged: str) -> str:
        """The statement appending ``staged``'s history rows (``history``) to ``target``."""
        names = [column_name(c.name) for c in schema.columns] + [name for name, _ in history.COLUMNS]
        extra = ", ".join(f"S.{name}" for name, _ in history.COLUMNS)
        return f"INSERT INTO {target} ({', '.join(names)}) SELECT {self._converted(schema)}, {extra} FROM {staged} AS S"

    def _add_and_remove(self, schema: TableSchema, target: str, staging: str, removes: bool) -> list[str]:
        """Statements applying ``staging``'s net copies per row image (``NET``) to a table without a key.

        Rows are told apart by their whole image, as text (``TO_JSON_STRING``: arrays and JSON have no
        equality). An image losing copies has all its stored occurrences deleted and the remaining
        number inserted again; an image gaining copies has them inserted. Without ``removes`` (only
        inserts) the copies are inserted and the table is not read; otherwise it is scanned twice.
        """
        names = [column_name(c.name) for c in schema.columns]
        if not removes:
            return [
                f"INSERT INTO {target} ({', '.join(names)}) SELECT {self._converted(schema)} FROM {staging} AS S"
                f" CROSS JOIN UNNEST(GENERATE_ARRAY(1, S.{NET})) AS _etl_copy"
            ]

        def image(alias: str) -> str:
            return f"TO_JSON_STRING(STRUCT({', '.join(f'{alias}.{n}' for n in names)}))"

        copies = f"IF(C.{NET} < 0, IFNULL(N._etl_stored, 0) + C.{NET}, C.{NET})"
        return [
            f"CREATE TEMP TABLE {CHANGES} AS WITH C AS (SELECT {self._converted(schema)}, S.{NET} FROM {staging} AS S)"
            f" SELECT C.*, {image('C')} AS _etl_image FROM C",
            f"CREATE TEMP TABLE {STORED} AS SELECT {image('T')} AS _etl_image, COUNT(*) AS _etl_stored"
            f" FROM {target} AS T WHERE {image('T')} IN (SELECT _etl_image FROM {CHANGES} WHERE {NET} < 0)"
            " GROUP BY _etl_image",
            f"DELETE FROM {target} AS T WHERE {image('T')} IN (SELECT _etl_image FROM {STORED})",
            f"INSERT INTO {target} ({', '.join(names)}) SELECT {', '.join(f'C.{n}' for n in names)}"
            f" FROM {CHANGES} AS C LEFT JOIN {STORED} AS N ON N._etl_image = C._etl_image"
            f" CROSS JOIN UNNEST(GENERATE_ARRAY(1, {copies})) AS _etl_copy",
            f"DROP TABLE {CHANGES}",
            f"DROP TABLE {STORED}",
        ]

    def _advance(self, schema: TableSchema, position: Position) -> list[str]:
        lsn, ordinal = position
        return [
            f"DELETE FROM {self._ref(WATERMARKS)} WHERE {self._watermark_row(schema)}",
            f"INSERT INTO {self._ref(WATERMARKS)} (pipeline_id, table_oid, commit_lsn, tx_ordinal)"
            f" VALUES ({int(self.pipeline_id)}, {int(schema.id)}, {int(lsn)}, {int(ordinal)})",
        ]

    def _watermark(self, schema: TableSchema) -> Position:
        if schema.id not in self._watermarks:
            rows = list(
                self._query(
                    f"SELECT commit_lsn, tx_ordinal FROM {self._ref(WATERMARKS)} WHERE {self._watermark_row(schema)}"
                )
            )
            self._watermarks[schema.id] = (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)
        return self._watermarks[schema.id]

    def _watermark_row(self, schema: TableSchema) -> str:
        return f"pipeline_id = {int(self.pipeline_id)} AND table_oid = {int(schema.id)}"

    # -- table shape -----------------------------------------------------------------------------
    def _prepare(self, schema: TableSchema) -> str:
        """The target table, created or altered to match ``schema``, which is then recorded as applied."""
        target = self._ref(table_id(schema.name))
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
            self._query(f"CREATE TABLE IF NOT EXISTS {target} ({columns}) {options}", schema)
        table = self.client.get_table(self._path(table_id(schema.name)))
        own = history.own_columns([f.name for f in table.schema]) if historic else frozenset()
        actions = alter_statements(table, applied or unrecorded(table, schema, own), schema, own, keep_dropped=historic)
        # BigQuery runs DDL outside transactions only: the record follows the ALTERs in the same script.
        with self._metadata:
            self._query(
                ";\n".join([*(f"ALTER TABLE {target} {a}" for a in actions), *self._record(schema)]) + ";", schema
            )
        self._applied[schema.id] = schema
        return target

    def _check_mode(self, schema: TableSchema) -> None:
        """A table written in the other ``mode`` errors (its rows mean something else)."""
        table = self.client.get_table(self._path(table_id(schema.name)), retry=self._retry)
        historic = history.is_history_table([f.name for f in table.schema])
        if historic != (self.config.mode == "history"):
            raise TableError(
                f"{schema.name}: its BigQuery table was written in {'history' if historic else 'apply'} mode, and the"
                f" destination now runs in {self.config.mode} mode",
                hint="resync the table (etl resync) to rebuild it in this mode, or set the destination's mode back",
                table_id=schema.id,
            )

    def _recorded(self, schema: TableSchema) -> TableSchema | None:
        rows = self._query(
            f"SELECT column_name, type_oid, type_modifier, attnum FROM {self._ref(COLUMNS)}"
            f" WHERE {self._columns_row(schema)} ORDER BY position"
        )
        columns = tuple(ColumnSchema(r[0], int(r[1]), int(r[2]), attnum=r[3]) for r in rows)
        return TableSchema(schema.id, schema.name, columns) if columns else None

    def _record(self, schema: TableSchema) -> list[str]:
        values = ", ".join(
            f"('{table_id(schema.name)}', {i}, '{c.name}', {int(c.type_oid)}, {int(c.type_modifier)},"
            f" {'NULL' if c.attnum is None else int(c.attnum)})"
            for i, c in enumerate(schema.columns)
        )
        return [
            "BEGIN TRANSACTION",
            f"DELETE FROM {self._ref(COLUMNS)} WHERE {self._columns_row(schema)}",
            f"INSERT INTO {self._ref(COLUMNS)} (table_name, position, column_name, type_oid, type_modifier, attnum)"
            f" VALUES {values}",
            "COMMIT TRANSACTION",
        ]

    def _columns_row(self, schema: TableSchema) -> str:
        return f"table_name = '{table_id(schema.name)}'"

    # -- staging ---------------------------------------------------------------------------------
    @staticmethod
    def _staged(schema: TableSchema, rows: pa.Table, *, changes: bool) -> pa.Table:
        """Arrow rows or changes with row columns in their staging form (checked: columns BigQuery has no type
        for, then values it cannot hold, error the table)."""
        check_columns(schema)
        columns = {c.name: c for c in schema.columns}
        arrays: list[pa.ChunkedArray] = []
        for name in rows.column_names:
            values = rows[name]
            if name in columns:
                values = staged(schema, columns[name], values)
            elif name in (COMMIT_LSN_COLUMN, TX_ORDINAL_COLUMN):
                values = values.cast(pa.int64())  # Spark has no unsigned types
            arrays.append(values)
        table = pa.table(arrays, names=rows.column_names)
        return _with_staged_old(schema, table) if changes else table.select(schema.column_names)

    def _flatten(self, collapsed: DataFrame, key: list[str]) -> DataFrame:
        from pyspark.sql import functions as sf

        return collapsed.select(
            *[sf.col(c) for c in collapsed.columns if c not in (PRIOR_KEY, "_etl_missing")],
            *[sf.col(PRIOR_KEY)[k].alias(f"_etl_prior_{k}") for k in key],
            sf.concat(sf.lit(","), sf.array_join(sf.col("_etl_missing"), ","), sf.lit(",")).alias(MISSING_TEXT),
        )

    @contextmanager
    def _staging(self, frames: list[DataFrame], nbytes: int, label: str) -> Iterator[list[str]]:
        """Stage ``frames`` side by side with one load job into a new staging table (more only past BigQuery's
        column limit); yield a subquery of each frame's rows (``staging.source``). The table is dropped
        afterwards (a crash leaves it to the next start, ``_drop_leftover_staging``), its Parquet files as
        soon as it is loaded.

        Each load fills a table of its own: BigQuery limits modifications per table per day, and
        writers (the apply worker, table copies) stage concurrently.
        """
        names: list[str] = []
        sources: list[str] = []
        try:
            for run in groups(frames):
                frame, parts = side_by_side(run)
                names.append(table_prefix(self.pipeline_id) + uuid.uuid4().hex)
                self._load(frame, nbytes, names[-1], label)
                sources += [source(self._ref(names[-1]), part) for part in parts]
            yield sources
        finally:
            for name in names:
                self._drop_staging(name)

    def _load(self, frame: DataFrame, nbytes: int, name: str, label: str) -> None:
        """Write ``frame`` as Parquet to the staging location and load it into the new table ``name``."""
        from google.cloud import bigquery

        local = self.config.staging_local_dir
        bucket, _, prefix = self.config.staging_uri.removeprefix("gs://").partition("/")
        relative = f"{prefix}/{name}" if prefix else name
        written = f"{local.rstrip('/')}/{relative}" if local else f"{self.config.staging_uri}/{name}"
        files = max(1, nbytes // (256 * 1024 * 1024))
        frame.coalesce(files).write.mode("overwrite").parquet(written)
        staged_bytes = _parquet_bytes(self.spark, written)
        job_config = bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.PARQUET,
            write_disposition=bigquery.WriteDisposition.WRITE_TRUNCATE,
        )
        job_config.parquet_options = bigquery.ParquetOptions()  # type: ignore[no-untyped-call]
        job_config.parquet_options.enable_list_inference = True
        try:
            try:
                job = self.client.load_table_from_uri(
                    f"gs://{bucket}/{relative}/*.parquet", self._path(name), job_config=job_config, retry=self._retry
                )
                job.result(retry=self._retry)
            except Exception as exc:
                error = classify(exc, f"loading staged rows ({label})")
                if error is None:
                    raise
                raise error from None
            self.metrics.load_jobs.labels(label).inc()
            self.metrics.bytes_loaded.inc(staged_bytes)
        finally:
            delete_path(self.spark, written)  # loaded or failed, the staged files are not needed again

    def _drop_staging(self, name: str) -> None:
        """Drop a staging table; a failure is logged, never raised (it would hide the write's own outcome)."""
        try:
            self.client.delete_table(self._path(name), not_found_ok=True, retry=self._retry)
        except Exception as exc:
            log.warning("could not drop a staging table; the next start drops it", table=name, error=str(exc))

    def _drop_leftover_staging(self, tables: set[str]) -> None:
        """Drop the staging tables (of the dataset's ``tables``) this pipeline left behind when it last stopped
        mid-write."""
        prefix = table_prefix(self.pipeline_id)
        for name in tables:
            if name.startswith(prefix):
                self.client.delete_table(self._path(name), not_found_ok=True, retry=self._retry)

    def _converted(self, schema: TableSchema) -> str:
        return ", ".join(
            f"{self._conversion(schema, column_name(c.name))} AS {column_name(c.name)}" for c in schema.columns
        )

    @staticmethod
    def _conversion(schema: TableSchema, quoted: str) -> str:
        column = next(c for c in schema.columns if column_name(c.name) == quoted)
        return bq_type(column).load.format(f"S.{quoted}")

    # -- helpers ---------------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return f"{self.config.project}.{self.config.dataset}.{name}"

    def _ref(self, name: str) -> str:
        return f"`{self._path(name)}`"

    def _dml(self, sql: str, table: TableSchema) -> None:
        """Run the query job that moves staged rows into ``table``'s target, timed (``etl_bigquery_dml_seconds``)."""
        started = time.perf_counter()
        self._query(sql, table)
        self.metrics.dml_seconds.observe(time.perf_counter() - started)

    def _query(self, sql: str, table: TableSchema | None = None) -> Any:
        """Run ``sql``; a statement rejected while writing ``table`` errors that table only."""
        from google.api_core import exceptions

        try:
            return self.client.query_and_wait(
                sql, location=self.config.location, retry=self._retry, job_retry=self._job_retry
            )
        except exceptions.BadRequest as exc:
            if passes(exc):  # a 400 that is not about the statement
                raise _classified(exc, sql, table) or exc from None
            log.warning("bigquery rejected a statement", sql=sql, error=exc.message)
            if table is not None:
                raise TableError(
                    f"{table.name}: BigQuery rejected its data: {exc.message}",
                    hint="a value BigQuery cannot hold; fix it at the source, then resync the table",
                    table_id=table.id,
                ) from None
            raise DestinationError(f"BigQuery rejected a statement: {exc.message}", hint="see the log") from None
        except Exception as exc:
            error = _classified(exc, sql, table)
            if error is None:
                raise
            raise error from None


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


def _classified(exc: Exception, sql: str, table: TableSchema | None) -> EtlError | None:
    """``exc`` as the engine's error (``errors.classify``); ``None`` when it is not BigQuery's."""
    doing = f"writing {table.name}" if table is not None else "running " + sql.split(" ", 1)[0].lower()
    return classify(exc, doing)


def _parquet_bytes(spark: SparkSession, path: str) -> int:
    """The size of the Parquet files Spark wrote into the directory ``path`` (local or ``gs://``), through
    Spark's Hadoop file system, as ``delete_path`` reaches it."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    directory = jvm.org.apache.hadoop.fs.Path(path)
    fs = directory.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return sum(int(s.getLen()) for s in fs.listStatus(directory) if str(s.getPath().getName()).endswith(".parquet"))


def _integer_range(schema: TableSchema, collapsed: pa.Table) -> tuple[int, int] | None:
    """The least and greatest touched value of the first key column, when it is an integer one."""
    first = schema.key_columns[0]
    if bq_type(first).ddl != "INT64":
        return None
    bounds = pc.min_max(collapsed[first.name])
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return None if low is None or high is None else (int(low), int(high))


def _shape(schema: TableSchema) -> list[tuple[str, int, int, int | None]]:
    return [(c.name, c.type_oid, c.type_modifier, c.attnum) for c in schema.columns]


def _with_staged_old(schema: TableSchema, table: pa.Table) -> pa.Table:
    """The ``_etl_old`` struct with its fields in staging form too."""
    old = table[OLD_COLUMN].combine_chunks()
    columns = {c.name: c for c in schema.columns}
    children = [staged(schema, columns[f.name], old.field(i)).combine_chunks() for i, f in enumerate(old.type)]
    mask = pc.invert(old.is_valid()) if old.null_count else None
    struct = pa.StructArray.from_arrays(children, names=[f.name for f in old.type], mask=mask)
    return table.set_column(table.column_names.index(OLD_COLUMN), OLD_COLUMN, struct)
