"""Sustained streaming into DuckLake, beside the engine's streaming into the null destination in the same run.

The workload table starts with ``--base`` rows. Four pipelines (SQLite stores) copy it and reach Ready,
then stop, so their slots wait at the same position: the null destination (``run_engine.py``) and
three DuckLake lakes (SQLite catalogs, Spark ``local[*]`` in this process). A workload of ``--rows``
row changes then runs in transactions of 10: 7 inserts, 2 updates (a new row and a copied one) and
1 delete (of a copied row), so most batches both add data files and write positional delete files
found by a Spark scan of the table's live rows. Each pipeline then drains the same backlog, one after
the other, timed from ``Pipeline.start()`` until its destination wrote every change:

- null destination, engine defaults: the engine's own rate, the reference for the ratios;
- DuckLake, engine defaults (a batch is cut at 8 MiB or after 1 s, and grows up to 64 MiB while the
  previous write runs);
- DuckLake, large batches (64 MiB or 10 s): Spark's fixed cost per job spread over more rows;
- DuckLake, 1 s batches (cut by time only): each Spark job gets what the engine read in a second.

With ``--tables N`` the workload spreads over N tables of the same shape (``--base`` rows split among
them), transaction ``i`` going to table ``i % N``: each batch then touches up to N tables, planned side
by side. Compare its rates with a run of one table: the issue asks for 0.8x of it at 20 tables.

With ``--large`` the workload is one transaction of ``--rows`` inserts instead, drained by the null destination and
the lake of engine defaults only: the stream hands it over in many batches, which the lake must commit as one
snapshot (issue 50). The run prints the snapshots the transaction made and this process's peak RSS during the
lake's run (``VmHWM``, reset before it through ``/proc/self/clear_refs``; Spark's JVM not counted) beside the null
destination's.
``--large-updates`` makes that transaction update every row of ``--base`` first (old rows anywhere in the lake).

Afterwards DuckDB 1.5.5 reads every lake's row counts back; they must equal the source tables'.

Data files are snappy, as DuckDB writes them, unless ``--compression`` sets the lakes' ``parquet_compression``
(runs before 2026-11-27 wrote zstd).

    .tox/tests/bin/python bench/ducklake_streaming.py [--rows 500000] [--base 200000] [--tables 1] [--compression zstd]
        [--large [--large-updates]]
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
from benchlib import TABLE, Engine, Line
from ducklake_copy import lake, lake_count, pipeline_config, run_ducklake, show, start_spark
from run_engine import peak_rss_mb

from etl_spark.ducklake.config import DuckLakeConfig
from etl_spark.ducklake.reader import open_lake
from etl_store_sqlite.store import SqliteStore

CHANGES_PER_TRANSACTION = 10

WORKLOAD = f"""
CREATE OR REPLACE PROCEDURE bench_ducklake(transactions int, first_id bigint, base bigint, tables text[])
LANGUAGE plpgsql AS $$
DECLARE b bigint; j bigint; t text;
BEGIN
    FOR i IN 0 .. transactions - 1 LOOP
        t := tables[1 + i % cardinality(tables)];
        j := i / cardinality(tables);
        b := first_id + i::bigint * 7;
        EXECUTE format('INSERT INTO %I SELECT {benchlib.row_values("g").replace("'", "''").replace("%", "%%")}'
                       ' FROM generate_series($1, $1 + 6) g', t) USING b;
        EXECUTE format('UPDATE %I SET score = score + 1, name = ''updated '' || id WHERE id IN ($1, $2)', t)
            USING b, 1 + (2 * j) % base;
        EXECUTE format('DELETE FROM %I WHERE id = $1', t) USING 2 + (2 * j) % base;
        COMMIT;
    END LOOP;
END $$;
"""

# name, batch settings of the pipeline (None: the engine's defaults)
LAKES: list[tuple[str, dict[str, Any]]] = [
    ("engine defaults (8 MiB or 1 s, 64 MiB while writing)", {}),
    ("large batches (64 MiB or 10 s)", {"max_fill_ms": 10_000, "max_bytes": 64 * 2**20}),
    ("1 s batches (by time only)", {"max_fill_ms": 1000, "max_bytes": 2**40}),
]


def snapshots(config: DuckLakeConfig) -> int:
    """The snapshots in the lake."""
    con = open_lake(config.catalog.get_secret_value())
    try:
        row = con.execute("SELECT count(*) FROM ducklake_snapshots('lake')").fetchone()
        return int(row[0]) if row else 0
    finally:
        con.close()


def null_run(src: benchlib.Source, mode: str, pipeline_id: int, store: Path, rows: int = 0) -> Line | None:
    child = Engine(src, mode, "--rows", str(rows), "--pipeline-id", str(pipeline_id), "--store", str(store))
    try:
        done = child.expect("done")
        child.wait()
    finally:
        child.kill()
    if mode != "stream":
        return None
    return Line(
        "engine -> null destination (defaults)",
        done["rows"],
        done["seconds"],
        done["peak_rss_mb"],
        done["cpu_seconds"],
        note=f"{done['batches']} batches",
    )


def main() -> int:
    parser = benchlib.arguments(__doc__ or "")
    parser.add_argument("--rows", type=int, default=500_000, help="row changes (a multiple of 10)")
    parser.add_argument("--base", type=int, default=200_000, help="rows in the tables before the workload")
    parser.add_argument("--tables", type=int, default=1, help="tables the workload spreads over")
    parser.add_argument(
        "--compression", help="the lakes' parquet_compression option (default: none set, so DuckLake's snappy)"
    )
    parser.add_argument("--large", action="store_true", help="one transaction of --rows inserts")
    parser.add_argument(
        "--large-updates", action="store_true", help="with --large: the transaction updates every row of --base too"
    )
    args = parser.parse_args()
    transactions = args.rows // CHANGES_PER_TRANSACTION
    per_table = args.base // args.tables
    fits = args.rows % CHANGES_PER_TRANSACTION == 0 and per_table >= 2 * (transactions // args.tables + 1) + 2
    if not (args.large or fits):
        parser.error("--rows must be a multiple of 10, and --base at least --rows / 5 + 2 (deletes hit copied rows)")
    tables = [TABLE, *(f"{TABLE}_{k}" for k in range(2, args.tables + 1))]
    with (
        benchlib.source(args) as src,
        tempfile.TemporaryDirectory(prefix="etl-bench-") as workdir,
        contextlib.ExitStack() as lakes,
    ):
        print(f"machine: {benchlib.machine()}")
        print(f"server:  {src.server_version()} ({src.install.bindir})")
        for name in tables:
            if name != TABLE:
                src.execute(f"CREATE TABLE {name} (LIKE {TABLE} INCLUDING ALL)")
                src.execute(f"ALTER PUBLICATION {benchlib.PUBLICATION} ADD TABLE {name}")
            src.execute(f"INSERT INTO {name} SELECT {benchlib.row_values('g')} FROM generate_series(1, {per_table}) g")
            src.execute(f"VACUUM (FREEZE, ANALYZE) {name}")
        print(f"tables:  {len(tables)}, {per_table:,} rows each before the workload")
        print(f"spark:   session started and warmed up in {start_spark():.1f} s (once per process; not timed below)")
        kinds = LAKES[:1] if args.large else LAKES
        stores = [Path(workdir) / f"store-{i}.sqlite" for i in range(1 + len(kinds))]
        null_run(src, "ready", 1, stores[0])
        configs = []
        for index, (_, batch) in enumerate(kinds, start=2):
            lake_config = lakes.enter_context(lake(src, "sqlite", f"bench_lake_{index}", compression=args.compression))
            config = pipeline_config(src, index, **batch)
            started = time.perf_counter()
            run_ducklake(config, lake_config, per_table * len(tables), SqliteStore(stores[index - 1], index), "copied")
            print(f"  DuckLake pipeline {index}: copied and ready in {time.perf_counter() - started:.1f} s", flush=True)
            configs.append((config, lake_config))

        started = time.perf_counter()
        with src.connect() as conn:
            if args.large:
                first = 10 * args.base
                with conn.transaction():
                    if args.large_updates:  # old rows anywhere: each part's deletes land in the lake's files
                        conn.execute(f"UPDATE {TABLE} SET score = score + 1")
                    conn.execute(
                        f"INSERT INTO {TABLE} SELECT {benchlib.row_values('g')}"
                        f" FROM generate_series({first}, {first + args.rows - 1}) g"
                    )
                transactions = 1
            else:
                conn.execute(WORKLOAD)
                array = "ARRAY[" + ", ".join(f"'{name}'" for name in tables) + "]"
                conn.execute(f"CALL bench_ducklake({transactions}, {10 * args.base}, {per_table}, {array})")
        expected = [src.scalar(f"SELECT count(*) FROM {name}") for name in tables]
        print(
            f"workload: {args.rows:,} changes in {transactions:,} transactions, {time.perf_counter() - started:.1f} s"
        )

        changes = args.rows + (args.base if args.large and args.large_updates else 0)
        baseline = null_run(src, "stream", 1, stores[0], changes)
        assert baseline is not None
        lines = []
        for (name, _), (config, lake_config) in zip(kinds, configs, strict=True):
            pipeline_id = config.pipeline.id
            store = SqliteStore(stores[pipeline_id - 1], pipeline_id)
            before = snapshots(lake_config)
            Path("/proc/self/clear_refs").write_text("5")  # VmHWM from here on
            at_start = peak_rss_mb()
            seconds, stats = run_ducklake(config, lake_config, changes, store, "changed")
            peak = peak_rss_mb()
            counted = [lake_count(lake_config, name)[0] for name in tables]
            if counted != expected:
                raise RuntimeError(f"DuckDB reads {counted} rows in lake {pipeline_id}, the tables have {expected}")
            writes = max(stats.writes, 1)
            size, each = stats.changed_rows / writes, stats.write_seconds / writes
            note = f"{stats.writes} writes of {size:,.0f} rows, {each:.2f} s each"
            if args.large:
                made = snapshots(lake_config) - before
                note += f"; {made} snapshot(s); peak RSS {peak:.0f} MB ({at_start:.0f} at start)"
            lines.append(Line(f"engine -> DuckLake, {name}", stats.changed_rows, seconds, note=note))
            print(f"  {name}: {seconds:.1f} s; DuckDB reads {sum(counted):,} rows", flush=True)
        spread = f", over {len(tables)} tables" if len(tables) > 1 else ""
        shape = "one transaction" if args.large else f"transactions of 10{spread}"
        show(f"streaming {changes:,} changes ({shape}) into DuckLake", baseline, *lines)
        if args.large:
            print(f"  peak RSS of the null destination's process: {baseline.peak_rss_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
