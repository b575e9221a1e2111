"""The bigquery destination's calls to BigQuery: its client, query jobs, and load jobs into staging tables.

A write stages its frames with one load job into a staging table of its own (``staging``), reads them back
from there in the query job that applies them, and drops the table (a crash leaves it to the next start). A
statement BigQuery rejects while writing a table errors that table only; other failures are classified as
the engine's errors (``errors.classify``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from etl.api import DestinationError, EtlError, TableError, TableSchema
from etl_spark.bigquery.client import make_client
from etl_spark.bigquery.config import BigQueryConfig
from etl_spark.bigquery.errors import classify, passes
from etl_spark.bigquery.metrics import BigQueryMetrics
from etl_spark.bigquery.staging import groups, side_by_side, source, table_prefix
from etl_spark.session import delete_path

if TYPE_CHECKING:
    from google.cloud import bigquery
    from pyspark.sql import DataFrame, SparkSession

log = structlog.get_logger(__name__)


@dataclass
class Staged:
    """What ``Jobs.staging`` loaded: a subquery of each frame's rows, and how many rows the loads took in."""

    sources: list[str]
    rows: int


class Jobs:
    """The client of one destination (opened at its start) and the jobs it runs; ``spark`` gives the session
    that writes staged Parquet."""

    def __init__(
        self, config: BigQueryConfig, pipeline_id: int, metrics: BigQueryMetrics, spark: Callable[[], SparkSession]
    ) -> None:
        self.config = config
        self.pipeline_id = pipeline_id
        self.metrics = metrics
        self._spark = spark
        self._client: bigquery.Client | None = None

    def open(self) -> bigquery.Client:
        self._client = make_client(self.config)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()  # type: ignore[no-untyped-call]
            self._client = None

    @property
    def retry(self) -> Any:
        """The client's retry of one API call, bounded by ``api_retry_seconds``."""
        from google.cloud.bigquery.retry import DEFAULT_RETRY

        return DEFAULT_RETRY.with_timeout(self.config.api_retry_seconds)

    @property
    def job_retry(self) -> Any:
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

    @contextmanager
    def staging(
        self,
        frames: list[DataFrame],
        nbytes: int,
        label: str,
        *,
        run: Callable[[Callable[[], None]], int] | None = None,
    ) -> Iterator[Staged]:
        """Stage ``frames`` side by side with one load job into a new staging table (more only past BigQuery's
        column limit); yield a subquery of each frame's rows (``staging.source``). The table is dropped
        afterwards (a crash leaves it to the next start, ``drop_leftover_staging``), its Parquet files as
        soon as it is loaded.

        Each load fills a table of its own: BigQuery limits modifications per table per day, and
        writers (the apply worker, table copies) stage concurrently. Rows a write built on the driver are
        written to about 256 MB per file; with ``run`` (a copy's Spark job: it runs the write it is given and says
        how many rows it wrote), the frame's tasks read and write their rows themselves, a file each, and no rows
        written load nothing (no staging table, no source: the caller sees ``rows == 0``).
        """
        names: list[str] = []
        staged = Staged([], 0)
        try:
            for group in groups(frames):
                frame, parts = side_by_side(group)
                name = table_prefix(self.pipeline_id) + uuid.uuid4().hex
                loaded = self._load(frame, nbytes, name, label, run)
                if run is not None and not loaded:
                    continue
                names.append(name)
                staged.rows += loaded
                staged.sources += [source(self.ref(name), part) for part in parts]
            yield staged
        finally:
            for name in names:
                self._drop_staging(name)

    def _load(
        self, frame: DataFrame, nbytes: int, name: str, label: str, run: Callable[[Callable[[], None]], int] | None
    ) -> int:
        """Write ``frame`` as Parquet to the staging location and load it into the new table ``name``; the rows
        loaded."""
        from google.cloud import bigquery

        local = self.config.staging_local_dir
        bucket, _, prefix = self.config.staging_uri.removeprefix("gs://").partition("/")
        relative = f"{prefix}/{name}" if prefix else name
        written = f"{local.rstrip('/')}/{relative}" if local else f"{self.config.staging_uri}/{name}"
        job_config = bigquery.LoadJobConfig(
            source_format=bigquery.SourceFormat.PARQUET,
            write_disposition=bigquery.WriteDisposition.WRITE_TRUNCATE,
        )
        job_config.parquet_options = bigquery.ParquetOptions()  # type: ignore[no-untyped-call]
        job_config.parquet_options.enable_list_inference = True
        try:
            if run is None:
                frame.coalesce(max(1, nbytes // (256 * 1024 * 1024))).write.mode("overwrite").parquet(written)
            elif not run(lambda: frame.write.mode("overwrite").parquet(written)):
                return 0
            staged_bytes = _parquet_bytes(self._spark(), written)
            try:
                job = self.client.load_table_from_uri(
                    f"gs://{bucket}/{relative}/*.parquet", self.path(name), job_config=job_config, retry=self.retry
                )
                job.result(retry=self.retry)
            except Exception as exc:
                error = classify(exc, f"loading staged rows ({label})")
                if error is None:
                    raise
                raise error from None
            self.metrics.load_jobs.labels(label).inc()
            self.metrics.bytes_loaded.inc(staged_bytes)
            return int(job.output_rows or 0)
        finally:
            delete_path(self._spark(), written)  # loaded or failed, the staged files are not needed again

    def _drop_staging(self, name: str) -> None:
        """Drop a staging table; a failure is logged, never raised (it would hide the write's own outcome)."""
        try:
            self.client.delete_table(self.path(name), not_found_ok=True, retry=self.retry)
        except Exception as exc:
            log.warning("could not drop a staging table; the next start drops it", table=name, error=str(exc))

    def drop_leftover_staging(self, tables: set[str]) -> None:
        """Drop the staging tables (of the dataset's ``tables``) this pipeline left behind when it last stopped
        mid-write."""
        prefix = table_prefix(self.pipeline_id)
        for name in tables:
            if name.startswith(prefix):
                self.client.delete_table(self.path(name), not_found_ok=True, retry=self.retry)

    # -- helpers ---------------------------------------------------------------------------------
    def path(self, name: str) -> str:
        return f"{self.config.project}.{self.config.dataset}.{name}"

    def ref(self, name: str) -> str:
        return f"`{self.path(name)}`"

    def dml(self, sql: str, table: TableSchema) -> None:
        """Run the query job that moves staged rows into ``table``'s target, timed (``etl_bigquery_dml_seconds``)."""
        started = time.perf_counter()
        self.query(sql, table)
        self.metrics.dml_seconds.observe(time.perf_counter() - started)

    def query(self, sql: str, table: TableSchema | None = None) -> Any:
        """Run ``sql``; a statement rejected while writing ``table`` errors that table only."""
        from google.api_core import exceptions

        try:
            return self.client.query_and_wait(
                sql, location=self.config.location, retry=self.retry, job_retry=self.job_retry
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
