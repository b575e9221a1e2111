"""Initial copy into DuckLake, beside the engine's copy into the null destination in the same run.

Fills the workload table (default 2M rows), then:

1. engine -> null destination: ``run_engine.py copy`` (a child process, memory store, default copy
   settings), timed from ``Pipeline.start()`` until the null destination counted every row: what the
   engine reads and decodes per second with no destination cost;
2. engine -> DuckLake: the same pipeline into the ``ducklake`` destination, in this process (memory
   store; catalog in SQLite, or ``--catalog postgres`` for a database on the same server; Parquet under
   a temporary directory), timed from ``Pipeline.start()`` until every row is in a committed DuckLake
   snapshot. The copy runs as a Spark job whose tasks copy ranges of the table straight into data
   files. Once per Spark master of ``--masters`` (default ``local[2]`` and
   ``local-cluster[2,1,1024]``: two executor JVMs); each session starts before the clock (its
   start-up is printed on its own: a process pays it once);
3. DuckDB's own DuckLake writer: the same rows, already in memory as Arrow, written by
   ``INSERT INTO lake.t SELECT * FROM rows`` into a fresh SQLite-catalog lake (a reference line: what
   one machine gets without Spark, from rows already read).

``--incremental CHUNK_ROWS`` also runs the incremental copy into a fresh lake each time, its chunks read and
written by Spark's tasks as the snapshot copy's ranges are, until the table is ready.

DuckDB 1.5.5 reads each lake's row count back: it must equal the table's. The null and DuckLake
sides alternate ``--repeat`` times; the best run of each is reported.

The lake has no Parquet options unless ``--compression`` sets ``parquet_compression`` (through DuckDB, which
then creates the lake), so data files are snappy, as DuckDB writes them by default.

    .tox/tests/bin/python bench/ducklake_copy.py [--rows 2000000] [--catalog sqlite|postgres] [--repeat 1]
        [--masters 'local[2]' 'local-cluster[2,1,1024]'] [--compression zstd] [--incremental 50000]
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import bench_copy
import benchlib
import pyarrow as pa
from benchlib import PUBLICATION, TABLE, Line

from etl.config import PipelineConfig
from etl.destination.base import WriteResult
from etl.events import EventBatch
from etl.pipeline import Pipeline
from etl.store.base import Store, TableStateKind
from etl.store.memory import MemoryStore
from etl_spark.ducklake.config import SPARK_CONF, DuckLakeConfig
from etl_spark.ducklake.destination import DuckLakeDestination
from etl_spark.ducklake.reader import connect_duckdb, open_lake
from etl_spark.session import SparkSettings, get_spark, stop_spark


@dataclass
class WriteStats:
    """What a counting destination saw of streamed changes: rows, writes and the seconds spent in them."""

    changed_rows: int = 0
    writes: int = 0
    write_seconds: float = 0.0
    each: list[tuple[int, float]] = field(default_factory=list)
    """Every write's changes and seconds, in order."""
    reached: threading.Event = field(default_factory=threading.Event)


class Counting:
    """Mixed into a destination class: counts streamed changes and times their writes; ``stats.reached`` is set
    once ``target`` changes were written."""

    def count_to(self, target: int) -> None:
        self.target = target
        self.stats = WriteStats()
        self._lock = threading.Lock()

    def write_events(self, batch: EventBatch) -> WriteResult:
        started = time.perf_counter()
        result: WriteResult = super().write_events(batch)  # type: ignore[misc]  # the destination's
        self._count(started, changed=batch.row_count())
        return result

    def _count(self, started: float, changed: int) -> None:
        with self._lock:
            stats = self.stats
            seconds = time.perf_counter() - started
            stats.changed_rows += changed
            stats.writes += 1
            stats.write_seconds += seconds
            stats.each.append((changed, seconds))
            if stats.changed_rows >= self.target:
                stats.reached.set()


class CountingDuckLake(Counting, DuckLakeDestination):
    """The ducklake destination, counting (``Counting``)."""

    def __init__(self, config: DuckLakeConfig, pipeline_id: int, target: int) -> None:
        super().__init__(config, pipeline_id)
        self.count_to(target)


SPARK = SparkSettings(master="local[*]")


@contextlib.contextmanager
def lake(
    src: benchlib.Source, kind: str, name: str, spark: SparkSettings = SPARK, compression: str | None = None
) -> Iterator[DuckLakeConfig]:
    """A new, empty lake: SQLite catalog in a temporary directory, or a new database on the source server; made by
    DuckDB with ``parquet_compression`` set when ``compression`` is given."""
    with tempfile.TemporaryDirectory(prefix="etl-bench-lake-") as directory:
        if kind == "sqlite":
            catalog = f"sqlite:///{directory}/catalog.sqlite"
            target = f"sqlite:{directory}/catalog.sqlite"
        else:
            with src.connect("postgres") as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                conn.execute(f"CREATE DATABASE {name}")
            catalog = f"postgresql://postgres@127.0.0.1:{src.port}/{name}"
            target = f"postgres:host=127.0.0.1 port={src.port} dbname={name} user=postgres"
        try:
            if compression is not None:
                con = connect_duckdb("sqlite", "postgres")
                try:
                    con.execute(f"ATTACH 'ducklake:{target}' AS lake (DATA_PATH '{directory}/data/')")
                    con.execute("CALL lake.set_option('parquet_compression', ?)", [compression])
                finally:
                    con.close()
            yield DuckLakeConfig.model_validate(
                {"catalog": catalog, "data_path": f"{directory}/data/", "spark": spark.model_dump()}
            )
        finally:
            if kind != "sqlite":
                with src.connect("postgres") as conn:
                    conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def pipeline_config(
    src: benchlib.Source,
    pipeline_id: int,
    copy: dict[str, Any] | None = None,
    publication: str = PUBLICATION,
    metrics: dict[str, Any] | None = None,
    **batch: Any,
) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "pipeline": {"id": pipeline_id, "publication": publication},
            "source": src.connection().model_dump(),
            "batch": batch,
            "copy": copy or {},
            **({"metrics": metrics} if metrics is not None else {}),
        }
    )


def start_spark(settings: SparkSettings = SPARK, conf: dict[str, str] = SPARK_CONF) -> float:
    """Start a session (stopping one of other settings) with a destination's ``conf`` (DuckLake's by default) and run
    one small Arrow job on its executors (the first job loads Spark's classes and starts the Python workers)."""
    started = time.perf_counter()
    stop_spark()
    spark = get_spark(settings, conf)
    spark.createDataFrame(pa.table({"x": list(range(1000))})).mapInArrow(lambda b: b, "x long").collect()
    return time.perf_counter() - started


def lake_count(config: DuckLakeConfig, table: str = TABLE) -> tuple[int, int, int]:
    """Rows of a lake table as DuckDB reads them, its data files and their bytes."""
    con = open_lake(config.catalog.get_secret_value())
    try:
        rows = con.execute(f"SELECT count(*) FROM lake.public.{table}").fetchone()
        files = con.execute(
            "SELECT count(*), sum(data_file_size_bytes)"
            f" FROM ducklake_list_files('lake', '{table}', schema => 'public')"
        ).fetchone()
        if rows is None or files is None:
            raise RuntimeError(f"DuckDB found no lake table {table}")
        return int(rows[0]), int(files[0]), int(files[1] or 0)
    finally:
        con.close()


def run_ducklake(
    config: PipelineConfig, lake_config: DuckLakeConfig, target: int, store: Store, stop_when: str
) -> tuple[float, WriteStats]:
    """Run a pipeline into DuckLake until its copy is durable (``stop_when="copied"``: every table past
    its copy, whose last rows the engine's flush wrote) or ``target`` streamed changes were written."""
    return run_counted(config, CountingDuckLake(lake_config, config.pipeline.id, target), store, stop_when)


def run_counted(config: PipelineConfig, destination: Any, store: Store, stop_when: str) -> tuple[float, WriteStats]:
    """``run_ducklake`` for any ``Counting`` destination."""
    pipeline = Pipeline(config, store, destination)
    started = time.perf_counter()
    pipeline.start()
    try:

        def done() -> bool:
            return states_past(pipeline, COPYING) if stop_when == "copied" else destination.stats.reached.is_set()

        while not done():
            if pipeline.wait(timeout=0.01):
                raise RuntimeError("the pipeline stopped before the benchmark finished")
        seconds = time.perf_counter() - started
        while stop_when == "copied" and not states_past(pipeline, NOT_READY):  # its sync slot gone before the next run
            if pipeline.wait(timeout=0.1):
                raise RuntimeError("the pipeline stopped before its table was ready")
    finally:
        pipeline.shutdown(timeout=120)
    return seconds, destination.stats


COPYING = {TableStateKind.INIT, TableStateKind.DATA_SYNC, TableStateKind.COPYING}
NOT_READY = set(TableStateKind) - {TableStateKind.READY}


def states_past(pipeline: Pipeline, kinds: set[TableStateKind]) -> bool:
    """True once the pipeline knows its tables and none is in one of ``kinds``."""
    states = pipeline.states.snapshot() if pipeline.states is not None else {}
    return bool(states) and all(s.kind not in kinds for s in states.values())


def show(title: str, baseline: Line, *lines: Line) -> None:
    """Each line's rate beside the null destination's (the engine's own rate, measured in the same run)."""
    print(f"\n{title}")
    print(f"  {'':<44} {'rows':>10} {'seconds':>8} {'rows/s':>10} {'ratio':>6}")
    for line in (baseline, *lines):
        ratio = line.rate / baseline.rate
        print(
            f"  {line.name:<44} {line.rows:>10,} {line.seconds:>8.2f} {line.rate:>10,.0f} {ratio:>6.2f}"
            + (f"  {line.note}" if line.note else "")
        )


def fill(src: benchlib.Source, rows: int) -> float:
    started = time.perf_counter()
    src.execute(f"INSERT INTO {TABLE} SELECT {benchlib.row_values('g')} FROM generate_series(1, {rows}) g")
    src.execute(f"VACUUM (FREEZE, ANALYZE) {TABLE}")
    src.execute("CHECKPOINT")
    return time.perf_counter() - started


def ducklake_copy(
    src: benchlib.Source,
    rows: int,
    pipeline_id: int,
    *,
    catalog: str,
    spark: SparkSettings,
    compression: str | None,
    chunk_rows: int | None = None,
) -> Line:
    """The copy into a fresh lake: by snapshot, or incremental in chunks of ``chunk_rows``."""
    copy = None if chunk_rows is None else {"method": "incremental", "chunk_rows": chunk_rows}
    with lake(src, catalog, f"bench_lake_{pipeline_id}", spark, compression) as lake_config:
        seconds, _ = run_ducklake(
            pipeline_config(src, pipeline_id, copy), lake_config, rows, MemoryStore(pipeline_id), "copied"
        )
        counted, files, size = lake_count(lake_config)
    src.drop_slots()
    if counted != rows:
        raise RuntimeError(f"DuckDB reads {counted} rows in the lake, the table has {rows}")
    note = f"DuckDB reads {counted:,} rows in {files} data files of {size / 2**20:.0f} MiB"
    codec = compression or "snappy"
    method = "" if chunk_rows is None else f"incremental {chunk_rows:,}, "
    name = f"engine -> DuckLake ({method}{catalog} catalog, {spark.master}, {codec})"
    return Line(name, counted, seconds, note=note)


def duckdb_writer(src: benchlib.Source, rows: int) -> Line:
    """DuckDB's own DuckLake writer loading the table's rows from Arrow in memory (read by the engine's copy,
    not timed)."""
    from etl.postgres.catalog import publication_tables, table_schema
    from etl.postgres.connection import connect
    from etl.postgres.copy import copy_table

    with connect(src.connection()) as conn:
        (table,) = publication_tables(conn, PUBLICATION)
        schema = table_schema(conn, table.id, table.column_list)
    arrow = pa.Table.from_batches(list(copy_table(src.connection(), schema, table, None, 2)))  # noqa: F841 - read by DuckDB
    with tempfile.TemporaryDirectory(prefix="etl-bench-duckdb-") as directory:
        con = connect_duckdb("sqlite")
        con.execute(f"ATTACH 'ducklake:sqlite:{directory}/catalog.sqlite' AS lake (DATA_PATH '{directory}/data/')")
        con.execute(f"CREATE TABLE lake.{TABLE} AS SELECT * FROM arrow LIMIT 0")
        started = time.perf_counter()
        con.execute(f"INSERT INTO lake.{TABLE} SELECT * FROM arrow")
        seconds = time.perf_counter() - started
        found = con.execute(f"SELECT count(*) FROM lake.{TABLE}").fetchone()
        con.close()
    counted = int(found[0]) if found else 0
    if counted != rows:
        raise RuntimeError(f"DuckDB's writer loaded {counted} rows, the table has {rows}")
    note = "reference: no Spark, no source"
    return Line("DuckDB's DuckLake writer, from Arrow in memory", counted, seconds, note=note)


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each side; the best is reported")
    parser.add_argument("--catalog", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--masters", nargs="+", default=["local[2]", "local-cluster[2,1,1024]"])
    parser.add_argument(
        "--compression", help="the lake's parquet_compression option (default: none set, so DuckLake's snappy)"
    )
    parser.add_argument(
        "--incremental",
        type=int,
        metavar="CHUNK_ROWS",
        help="also the incremental copy in chunks of this many rows, each run, beside the snapshot copy",
    )
    args = parser.parse_args()
    with benchlib.source(args) as src:
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        seconds = fill(src, args.rows)
        size = src.scalar(f"SELECT pg_size_pretty(pg_table_size('{TABLE}'))")
        print(f"table:   {args.rows:,} rows, 9 columns of mixed types, {size} (filled in {seconds:.1f} s)")
        nulls: list[Line] = []
        best: list[Line] = []
        pipeline_id = 0
        for master in args.masters:
            spark = SparkSettings(master=master)
            print(f"spark:   {master} started and warmed up in {start_spark(spark):.1f} s (not timed below)")
            lakes: list[Line] = []
            chunked: list[Line] = []
            for run in range(args.repeat):
                nulls.append(bench_copy.engine(src, args.rows, pipeline_id := pipeline_id + 1))
                copy = partial(ducklake_copy, src, args.rows, catalog=args.catalog, spark=spark)
                lakes.append(copy(pipeline_id := pipeline_id + 1, compression=args.compression))
                line = f"  run {run + 1}: null {nulls[-1].seconds:.2f} s, DuckLake {lakes[-1].seconds:.2f} s"
                if args.incremental:
                    chunked.append(
                        copy(pipeline_id := pipeline_id + 1, compression=args.compression, chunk_rows=args.incremental)
                    )
                    line += f", incremental {chunked[-1].seconds:.2f} s"
                print(line)
            best.extend(min(lines, key=lambda line: line.seconds) for lines in (lakes, chunked) if lines)
        stop_spark()
        reference = duckdb_writer(src, args.rows)
        best_null = min(nulls, key=lambda line: line.seconds)
        show(f"copy of {args.rows:,} rows into DuckLake (best of {args.repeat})", best_null, *best, reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
