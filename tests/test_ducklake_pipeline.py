"""Pipelines from Postgres into DuckLake, read back by real DuckDB 1.5.5 with the ducklake extension from PyPI.

Each case runs a real ``Pipeline`` (SQLite store, the ``ducklake`` destination built from config through
the plugin registry) on a SQLite catalog and on a Postgres catalog, and compares what DuckDB reads with
the source, row for row: current contents, filtered queries on columns with statistics, time travel
(``AT (VERSION => n)``) and the change feed (``ducklake_table_changes``). Spark runs once per test process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
from psycopg.rows import dict_row

from etl.destination.base import PreviewableDestination
from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.schema import TableName
from etl.testing.pipelines import all_ready, pipeline_config, poll, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.ducklake.reader import open_lake
from etl_spark.session import running_master, stop_spark
from etl_spark.testing import comparable, comparable_source_rows, duckdb_rows, lake_rows, latest_snapshot, sorted_rows

pytestmark = pytest.mark.slow  # see docs/testing.md


@pytest.fixture(
    scope="module",
    params=["local[2]", pytest.param("local-cluster[2,1,1024]", marks=pytest.mark.xdist_group("local-cluster"))],
)
def spark(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """Spark settings for the pipeline: one JVM, or a standalone cluster of two executor JVMs. One session
    runs per process: a session of another master is stopped first, and a cluster's at the end (the
    worker's other tests use ``local[2]``). The cluster's tests share one worker (``xdist_group``)."""
    master = str(request.param)
    if running_master() not in (None, master):
        stop_spark()
    yield {"master": master, "conf": {"spark.sql.shuffle.partitions": "2"}}
    if master != "local[2]":
        stop_spark()


@dataclass
class Lake:
    """A lake location (catalog URL and data path) and DuckDB to read it."""

    url: str
    data_path: str

    def duckdb(self, *, read_only: bool = True) -> duckdb.DuckDBPyConnection:
        return open_lake(self.url, read_only=read_only)

    def rows(self, table: str, version: int | None = None) -> list[dict[str, Any]]:
        con = self.duckdb()
        try:
            return lake_rows(con, table, version=version)
        finally:
            con.close()

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        con = self.duckdb()
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()

    def snapshot(self) -> int:
        con = self.duckdb()
        try:
            return latest_snapshot(con)
        finally:
            con.close()


@pytest.fixture(params=["sqlite", "postgres"], ids=["sqlite-catalog", "postgres-catalog"])
def lake(request: pytest.FixtureRequest, pg_database: TestDatabase, tmp_path: Path) -> Iterator[Lake]:
    data_path = f"{tmp_path}/lake-data/"
    if request.param == "sqlite":
        yield Lake(f"sqlite:///{tmp_path}/catalog.sqlite", data_path)
        return
    name = f"{pg_database.name}_lake"
    pg_database.cluster.create_database(name)
    try:
        yield Lake(f"postgresql://postgres@127.0.0.1:{pg_database.cluster.port}/{name}", data_path)
    finally:
        pg_database.cluster.drop_database(name)


def start_pipeline(db: TestDatabase, lake: Lake, state: Path, spark: dict[str, Any]) -> Pipeline:
    """A pipeline built from config like ``etl run`` builds it: SQLite store, ducklake destination. Its copies are
    Spark jobs whatever the tables' size (``driver_copy_max_bytes = 0``): on both masters, what this module checks."""
    destination = {"type": "ducklake", "catalog": lake.url, "data_path": lake.data_path, "spark": spark}
    config = pipeline_config(
        db, store={"type": "sqlite", "path": str(state)}, destination=destination | {"driver_copy_max_bytes": 0}
    )
    store = build_store(config, "test")
    pipeline = Pipeline(config, store, build_destination(config, store, "test"))
    pipeline.start()
    return pipeline


def source_state(db: TestDatabase, *tables: str) -> dict[str, list[dict[str, Any]]]:
    with db.connect() as conn:
        return {t: comparable_source_rows(conn, t) for t in tables}


def lake_state(lake: Lake, *tables: str, version: int | None = None) -> dict[str, list[dict[str, Any]]]:
    con = lake.duckdb()
    try:
        return {t: lake_rows(con, t, version=version) for t in tables}
    finally:
        con.close()


def wait_equal(db: TestDatabase, lake: Lake, tables: tuple[str, ...], pipeline: Pipeline, timeout: float = 240) -> None:
    """Wait until DuckDB reads every table equal to the source, row for row."""

    def differing() -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
        """The first rows, in the source and in DuckDB, of each table that DuckDB reads otherwise."""
        expected, read = source_state(db, *tables), lake_state(lake, *tables)
        return {t: (expected[t][:5], read[t][:5]) for t in tables if read[t] != expected[t]}

    poll(
        differing,
        "DuckDB to read the source's rows (the tables that differ: source, DuckDB)",
        until=lambda tables_differing: not tables_differing,
        retry_on=(duckdb.Error,),  # a table not created yet
        pipeline=pipeline,
        timeout=timeout,
        least=0.5,
    )


def source_where(db: TestDatabase, table: str, where: str) -> list[dict[str, Any]]:
    with db.connect() as conn, conn.cursor(row_factory=dict_row) as cur:
        return sorted_rows(cur.execute(f"SELECT * FROM {TableName.parse(table).quoted()} WHERE {where}").fetchall())


def lake_where(lake: Lake, table: str, where: str) -> list[dict[str, Any]]:
    con = lake.duckdb()
    try:
        return duckdb_rows(con, f"SELECT * FROM lake.{TableName.parse(table).quoted()} WHERE {where}")
    finally:
        con.close()


def hashable(value: Any) -> Any:
    """Lists (array columns) as tuples, so rows can be counted."""
    return tuple(hashable(v) for v in value) if isinstance(value, list) else value


def as_tuples(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(hashable(v) for v in r.values()) for r in rows)


# -- copy, a mixed workload, truncate and DDL ----------------------------------------------------------

TABLES = ("public.accounts", "public.ledger", "public.keyless")


@pytest.fixture
def source(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        """
        CREATE TABLE accounts (id int PRIMARY KEY, name text NOT NULL, balance numeric(12,2), opened date,
                               updated timestamptz, active boolean, score double precision,
                               tags text[], uid uuid, due time);
        CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int, delta bigint, note text);
        CREATE TABLE keyless (a int, b text);
        ALTER TABLE keyless REPLICA IDENTITY FULL;
        INSERT INTO accounts SELECT g, 'acct ' || g, g * 1.25, DATE '2026-01-01' + g % 365,
                                    timestamptz '2026-01-01 00:00+00' + g * interval '1 minute', g % 3 = 0, g / 7.0,
                                    CASE WHEN g % 4 <> 0 THEN ARRAY['t' || g % 9, NULL] END,
                                    CASE WHEN g % 5 <> 0 THEN md5(g::text)::uuid END, time '08:00' + g * interval '1 s'
            FROM generate_series(1, 2000) g;
        INSERT INTO ledger (account, delta, note)
            SELECT g % 200, g % 11 - 5, CASE WHEN g % 9 = 0 THEN NULL ELSE 'entry ' || g END
            FROM generate_series(1, 3000) g;
        INSERT INTO keyless SELECT g % 6, CASE WHEN g % 4 = 0 THEN NULL ELSE 'dup' END FROM generate_series(1, 30) g;
        CREATE PUBLICATION pub FOR TABLE accounts, ledger, keyless;
        """
    )
    return pg_database


# Predicates on columns that carry min/max statistics, in SQL both Postgres and DuckDB read alike.
FILTERS = (
    "id BETWEEN 100 AND 200",
    "id > 100000",
    "id = 777",
    "balance < 50",
    "opened >= DATE '2026-12-01'",
    "updated < TIMESTAMPTZ '2026-01-01 03:00:00+00'",
    "name = 'acct 1500'",
    "name >= 'renamed'",
)


def check_filters(db: TestDatabase, lake: Lake) -> None:
    for where in FILTERS:
        assert lake_where(lake, "public.accounts", where) == source_where(db, "public.accounts", where), where


def test_copy_and_mixed_workload_read_by_duckdb(
    source: TestDatabase, lake: Lake, tmp_path: Path, spark: dict[str, Any]
) -> None:
    pipeline = start_pipeline(source, lake, tmp_path / "state.sqlite", spark)
    try:
        assert isinstance(pipeline.destination, PreviewableDestination)
        wait_until(lambda: all_ready(pipeline, 3), "every table ready", pipeline, timeout=240)
        wait_equal(source, lake, TABLES, pipeline)
        copied, after_copy = lake.snapshot(), source_state(source, *TABLES)
        check_filters(source, lake)

        # Inserts, updates (also of the key, also moving keys past the copied bounds), deletes, in
        # transactions of several tables, and a keyless table's duplicates.
        source.execute(
            """
            BEGIN;
            INSERT INTO accounts VALUES (5001, 'new', 10.00, '2027-02-01', now(), true, 0.5),
                                        (5002, 'new 2', NULL, NULL, NULL, NULL, NULL);
            UPDATE accounts SET balance = balance + 1, updated = updated + interval '1 day' WHERE id % 10 = 0;
            UPDATE accounts SET tags = tags || 'more'::text, uid = md5(name)::uuid, due = '23:59:59.999999'
                WHERE id % 6 = 0;
            UPDATE accounts SET id = id + 100000, name = 'renamed ' || id WHERE id % 97 = 0;
            DELETE FROM accounts WHERE id BETWEEN 150 AND 170;
            INSERT INTO ledger (account, delta, note) SELECT g, 1, 'late' FROM generate_series(1, 50) g;
            COMMIT;
            """
        )
        source.execute("UPDATE ledger SET note = 'changed' WHERE id % 3 = 0")
        source.execute("DELETE FROM ledger WHERE id % 11 = 0")
        source.execute("UPDATE accounts SET name = 'again' WHERE id = 777")
        source.execute("UPDATE accounts SET id = 777777 WHERE id = 777")
        source.execute("DELETE FROM keyless WHERE ctid IN (SELECT ctid FROM keyless WHERE a = 1 LIMIT 1)")
        source.execute("UPDATE keyless SET b = 'changed' WHERE a = 2")
        source.execute("INSERT INTO keyless VALUES (9, NULL), (9, NULL)")
        wait_equal(source, lake, TABLES, pipeline)
        streamed, after_stream = lake.snapshot(), source_state(source, *TABLES)
        check_filters(source, lake)

        # Truncate, then schema changes between rows: add, rename and drop columns. Rows older than a column
        # added with a constant default hold it (Postgres's missing value), in the lake too; a keyless table's
        # delete of such a row matches it by that value.
        source.execute("TRUNCATE ledger, keyless")
        source.execute("INSERT INTO ledger (account, delta, note) VALUES (1, 1, 'after truncate')")
        source.execute("INSERT INTO keyless VALUES (2, 'old'), (2, 'old'), (3, 'kept')")
        wait_equal(source, lake, TABLES, pipeline)
        source.execute("ALTER TABLE keyless ADD COLUMN c int NOT NULL DEFAULT 7")
        source.execute("DELETE FROM keyless WHERE ctid IN (SELECT ctid FROM keyless WHERE a = 2 LIMIT 1)")
        source.execute(
            """ALTER TABLE accounts ADD COLUMN tier text, ADD COLUMN level int NOT NULL DEFAULT 0,
                                    ADD COLUMN motto text DEFAULT 'x, "y"'"""
        )
        source.execute("UPDATE accounts SET tier = 'gold' WHERE id < 50")
        source.execute("ALTER TABLE accounts RENAME COLUMN score TO rating")
        source.execute("ALTER TABLE accounts DROP COLUMN active")
        source.execute("INSERT INTO accounts (id, name, tier, rating) VALUES (6000, 'after ddl', 'new', 1.5)")
        source.execute("DELETE FROM accounts WHERE id BETWEEN 1000 AND 1010")
        source.execute("INSERT INTO keyless VALUES (1, 'back')")
        wait_equal(source, lake, TABLES, pipeline)
        check_filters(source, lake)
        columns = [r[0] for r in lake.query("SELECT column_name FROM (DESCRIBE lake.public.accounts)")]
        assert columns == [
            "id", "name", "balance", "opened", "updated", "rating", "tags", "uid", "due", "tier", "level", "motto"
        ]  # fmt: skip
        assert lake.query("SELECT DISTINCT level, motto FROM lake.public.accounts WHERE id < 6000") == [(0, 'x, "y"')]
        types = dict(lake.query("SELECT column_name, column_type FROM (DESCRIBE lake.public.accounts)"))
        assert (types["tags"], types["uid"], types["due"]) == ("VARCHAR[]", "UUID", "TIME")
        assert lake.query("SELECT count(*) FROM lake.public.ledger") == [(1,)]
    finally:
        pipeline.shutdown()

    # The filters above ran against columns that carry statistics in the catalog.
    stats = lake.query(
        "SELECT c.column_name FROM __ducklake_metadata_lake.ducklake_table_column_stats s"
        " JOIN __ducklake_metadata_lake.ducklake_column c USING (table_id, column_id)"
        " JOIN __ducklake_metadata_lake.ducklake_table t USING (table_id)"
        " WHERE t.table_name = 'accounts' AND t.end_snapshot IS NULL AND c.end_snapshot IS NULL"
        " AND s.min_value IS NOT NULL AND s.max_value IS NOT NULL"
    )
    assert {"id", "name", "balance", "opened", "updated"} <= {r[0] for r in stats}

    # Time travel: each recorded snapshot reads as the source did then.
    assert lake_state(lake, *TABLES, version=copied) == after_copy
    assert lake_state(lake, *TABLES, version=streamed) == after_stream

    # The change feed between them turns the copied rows into the streamed ones (updates are a delete
    # plus an insert; a change type DuckDB may also report as pre/post images is counted the same way).
    for table in TABLES:
        schema, name = table.split(".")
        con = lake.duckdb()
        try:
            feed = duckdb_rows(
                con, f"SELECT * FROM ducklake_table_changes('lake', '{schema}', '{name}', {copied + 1}, {streamed})"
            )
        finally:
            con.close()
        added: Counter[tuple[Any, ...]] = Counter()
        removed: Counter[tuple[Any, ...]] = Counter()
        for change in feed:
            row = tuple(
                hashable(comparable(v)) for k, v in change.items() if k not in ("snapshot_id", "rowid", "change_type")
            )
            target = added if change["change_type"] in ("insert", "update_postimage") else removed
            target[row] += 1
        assert feed, f"no changes reported for {table}"
        total = as_tuples(after_copy[table]) + added
        assert all(total[row] >= count for row, count in removed.items()), f"{table}: a change deleted a missing row"
        total.subtract(removed)
        assert +total == as_tuples(after_stream[table]), table


# -- DuckDB writes to and compacts the lake between two runs ---------------------------------------------

ITEMS = ("public.items",)


def item_files(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str | None]]:
    """The items table's active data files, each with its active delete file."""
    return [
        (str(data), None if delete is None else str(delete))
        for data, delete in con.execute(
            "SELECT data_file, delete_file FROM ducklake_list_files('lake', 'items', schema => 'public')"
        ).fetchall()
    ]


def test_duckdb_writes_and_compacts_between_runs(
    pg_database: TestDatabase, lake: Lake, tmp_path: Path, spark: dict[str, Any]
) -> None:
    db = pg_database
    db.execute(
        """
        CREATE TABLE items (id int PRIMARY KEY, label text, qty int, at timestamptz, amount numeric(10,2));
        INSERT INTO items SELECT g, 'item ' || g, g % 13, timestamptz '2026-03-01 00:00+00' + g * interval '1 hour',
                                 g / 4.0
            FROM generate_series(1, 2000) g;
        CREATE PUBLICATION pub FOR TABLE items;
        """
    )
    state = tmp_path / "state.sqlite"
    pipeline = start_pipeline(db, lake, state, spark)
    try:
        wait_until(lambda: all_ready(pipeline, 1), "table ready", pipeline, timeout=240)
        db.execute("UPDATE items SET qty = qty + 100 WHERE id % 5 = 0")
        db.execute("DELETE FROM items WHERE id % 7 = 0")
        wait_equal(db, lake, ITEMS, pipeline)
    finally:
        pipeline.shutdown()

    # While the pipeline is stopped: the source changes; DuckDB applies the same deletes to the lake
    # (the pipeline replays them onto rows that are gone), writes a table of its own, and compacts.
    db.execute("UPDATE items SET label = 'while stopped' WHERE id <= 20")
    db.execute("DELETE FROM items WHERE id BETWEEN 21 AND 40")
    db.execute("INSERT INTO items SELECT g, 'late ' || g, 1, now(), 1.5 FROM generate_series(5000, 5020) g")
    con = lake.duckdb(read_only=False)
    try:
        files_before = item_files(con)
        con.execute("DELETE FROM lake.public.items WHERE id BETWEEN 21 AND 40")
        con.execute("CREATE TABLE lake.main.notes AS SELECT range AS id, 'note ' || range AS text FROM range(500)")
        con.execute("DELETE FROM lake.main.notes WHERE id % 2 = 0")
        before = latest_snapshot(con)
        con.execute("CALL ducklake_rewrite_data_files('lake', delete_threshold => 0.0)")
        con.execute("CALL ducklake_merge_adjacent_files('lake')")
        changes = con.execute(
            "SELECT string_agg(changes_made, ',') FROM __ducklake_metadata_lake.ducklake_snapshot_changes"
            f" WHERE snapshot_id > {before}"
        ).fetchall()[0][0]
        con.execute("CALL ducklake_expire_snapshots('lake', older_than => now())")
        con.execute("CALL ducklake_cleanup_old_files('lake', cleanup_all => true)")
        files_after = item_files(con)
    finally:
        con.close()
    # DuckDB rewrote the files the pipeline wrote (applying every delete) and removed the old ones.
    assert "rewrite_delete" in changes, changes
    assert any(delete for _, delete in files_before) and not any(delete for _, delete in files_after)
    replaced = {data for data, _ in files_before} - {data for data, _ in files_after}
    assert replaced and not any(Path(path).exists() for path in replaced)
    pipeline = start_pipeline(db, lake, state, spark)
    try:
        wait_equal(db, lake, ITEMS, pipeline)
        # Changes to rows that now live in files DuckDB wrote.
        db.execute("UPDATE items SET label = 'after compaction', qty = -1 WHERE id % 3 = 0")
        db.execute("UPDATE items SET id = id + 10000 WHERE id BETWEEN 100 AND 110")
        db.execute("DELETE FROM items WHERE id % 10 = 1")
        db.execute("INSERT INTO items VALUES (9000, 'last', 0, now(), 0)")
        wait_equal(db, lake, ITEMS, pipeline)
        # The source table is renamed and moved to another schema; its next change takes the lake table along.
        db.execute("CREATE SCHEMA archive; ALTER TABLE items RENAME TO stock; ALTER TABLE stock SET SCHEMA archive")
        db.execute("UPDATE archive.stock SET qty = 7 WHERE id = 2")
        wait_equal(db, lake, ("archive.stock",), pipeline)
    finally:
        pipeline.shutdown()
    assert lake.query("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'lake' AND table_name = 'items'") == [
        (0,)
    ]
    assert lake.query("SELECT count(*), min(id) FROM lake.main.notes") == [(250, 1)]


# -- a resync swaps the table in one snapshot -------------------------------------------------------------


LIVE_TABLE_ID = (
    "SELECT table_id FROM __ducklake_metadata_lake.ducklake_table WHERE table_name = 'items' AND end_snapshot IS NULL"
)


def test_resync_replaces_the_table_in_one_snapshot_without_downtime(
    pg_database: TestDatabase, lake: Lake, tmp_path: Path, spark: dict[str, Any]
) -> None:
    """While a resync copies the table again, readers keep the old table; one snapshot swaps in the new one.

    Every snapshot from before the resync to after it reads the table with all its rows, the old ones or
    the new ones, never an empty or half-copied table.
    """
    db = pg_database
    db.execute(
        """
        CREATE TABLE items (id int PRIMARY KEY, label text, tags text[]);
        INSERT INTO items SELECT g, 'item ' || g, ARRAY['a' || g] FROM generate_series(1, 5000) g;
        CREATE PUBLICATION pub FOR TABLE items;
        """
    )
    pipeline = start_pipeline(db, lake, tmp_path / "state.sqlite", spark)
    try:
        wait_until(lambda: all_ready(pipeline, 1), "the table ready", pipeline, timeout=240)
        wait_equal(db, lake, ITEMS, pipeline)
        before = lake.snapshot()
        old_table = lake.query(LIVE_TABLE_ID)
        db.execute("UPDATE items SET label = 'new ' || id WHERE id <= 10")
        wait_equal(db, lake, ITEMS, pipeline)
        (table_id,) = [t.id for t in pipeline.store.get_table_schemas()]
        pipeline.resync(table_id)

        def new_table() -> bool:
            return lake.query(LIVE_TABLE_ID) != old_table

        wait_until(new_table, "the table copied again", pipeline, timeout=240)
        wait_until(lambda: all_ready(pipeline, 1), "the table ready again", pipeline, timeout=240)
        db.execute("INSERT INTO items VALUES (6000, 'after resync', ARRAY['z'])")
        wait_equal(db, lake, ITEMS, pipeline)
    finally:
        pipeline.shutdown()
    after = lake.snapshot()
    for version in range(before, after + 1):
        (count,) = lake.query(f"SELECT count(*) FROM lake.public.items AT (VERSION => {version})")[0]
        assert count >= 5000, f"snapshot {version} reads {count} rows"
