"""Pipelines from Postgres into BigQuery, read back from a local BigQuery server with google-cloud-bigquery.

Each case runs a real ``Pipeline`` (SQLite store, the ``bigquery`` destination built from config through
the plugin registry) against ``local-bigquery`` 0.4.0 (one server per test session, a dataset per test), and
compares what BigQuery returns with the source, typed value by typed value. Spark runs once per process.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions

from etl.cli import cmd_status
from etl.config import PipelineConfig
from etl.errors import DestinationError
from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.schema import TableName
from etl.store.base import APPLY_WORKER, TableStateKind
from etl.testing.pipelines import all_ready, pipeline_config, poll, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.bigquery.names import table_id
from etl_spark.testing import comparable_source_rows, sorted_rows
from etl_spark.testing.bigquery_emulator import PROJECT, BigQueryEmulator

SPARK = {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}}


def bigquery_destination(emulator: BigQueryEmulator, dataset: str) -> dict[str, Any]:
    """The ``[destination]`` section of a pipeline writing into ``dataset`` on the emulator."""
    return {
        "type": "bigquery",
        "project": PROJECT,
        "dataset": dataset,
        "staging_uri": "gs://staging/etl",
        "staging_local_dir": str(emulator.bucket_dir("staging")),
        "endpoint": emulator.endpoint,
        "spark": SPARK,
    }


def start_pipeline(config: PipelineConfig) -> Pipeline:
    """A pipeline built from config like ``etl run`` builds it."""
    store = build_store(config, "test")
    pipeline = Pipeline(config, store, build_destination(config, store, "test"))
    pipeline.start()
    return pipeline


def bigquery_rows(emulator: BigQueryEmulator, dataset: str, table: str) -> tuple[list[dict[str, Any]], Any]:
    """A table's rows as google-cloud-bigquery returns them (Python values), and the table's schema."""
    client = emulator.client()
    try:
        path = f"{PROJECT}.{dataset}.{table_id(TableName.parse(table))}"
        rows = client.query_and_wait(f"SELECT * FROM `{path}`")
        return [dict(r.items()) for r in rows], rows.schema
    finally:
        client.close()  # type: ignore[no-untyped-call]


def as_stored(value: Any, field: Any) -> Any:
    """A source value in the form the bigquery destination stores it (documented in docs/destinations/bigquery.md).

    JSON columns hold the parsed document and a NULL array reads back as ``[]``; everything else compares as
    psycopg returns it (numerics stored as exact text are compared by value, see ``read_both``).
    """
    if field.mode == "REPEATED" and value is None:
        return []
    if value is None:
        return None
    if field.field_type == "JSON":
        return json.loads(value)
    return value


def stored_decimal(value: Any) -> Any:
    """Exact decimal text read back as a Decimal, so ``1.50`` and ``1.5`` compare by value, not spelling."""
    return Decimal(value) if isinstance(value, str) else value


def read_both(db: TestDatabase, emulator: BigQueryEmulator, dataset: str, table: str) -> tuple[Any, Any]:
    """(source rows, BigQuery rows) of one table, both typed and sorted for ``==``."""
    stored, schema = bigquery_rows(emulator, dataset, table)
    fields = {f.name: f for f in schema}
    with db.connect() as conn:
        source = comparable_source_rows(conn, table)
    expected = [{k: as_stored(v, fields[k]) if k in fields else v for k, v in row.items()} for row in source]
    decimals = {k for row in source for k, v in row.items() if isinstance(v, Decimal)}

    def typed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted_rows([{k: stored_decimal(v) if k in decimals else v for k, v in r.items()} for r in rows])

    return typed(expected), typed(stored)


def wait_equal(
    db: TestDatabase,
    emulator: BigQueryEmulator,
    dataset: str,
    tables: tuple[str, ...],
    pipeline: Pipeline,
    *,
    timeout: float = 240,
) -> None:
    """Wait until BigQuery returns every table equal to the source, row for row."""

    def differing() -> dict[str, tuple[Any, Any]]:
        """The first rows, in the source and in BigQuery, of each table that BigQuery returns otherwise."""
        pairs = {t: read_both(db, emulator, dataset, t) for t in tables}
        return {t: (expected[:5], stored[:5]) for t, (expected, stored) in pairs.items() if expected != stored}

    poll(
        differing,
        "BigQuery to return the source's rows (the tables that differ: source, BigQuery)",
        until=lambda tables_differing: not tables_differing,
        retry_on=(exceptions.NotFound, exceptions.BadRequest),  # not created yet (the emulator answers 400)
        pipeline=pipeline,
        timeout=timeout,
        least=0.5,
    )


def dataset_for(db: TestDatabase, test: str) -> str:
    return f"{test}_pg{db.major}"


# -- copy and a mixed workload ----------------------------------------------------------------------------

TABLES = ("public.accounts", "public.ledger", "public.keyless", "public.tagged")


@pytest.mark.slow
def test_copy_and_mixed_workload_equal_source(
    pg_database: TestDatabase, bigquery_emulator: BigQueryEmulator, tmp_path: Path
) -> None:
    db, emulator = pg_database, bigquery_emulator
    db.execute(
        """
        CREATE TABLE accounts (id int PRIMARY KEY, name text NOT NULL, balance numeric(12,2), big numeric(30,15),
                               exact numeric, updated timestamptz, local timestamp, opened date, doc jsonb,
                               blob bytea, ref uuid, tags text[], active boolean, score double precision);
        CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account int, delta bigint, note text);
        INSERT INTO accounts
            SELECT g, 'acct ' || g, g * 1.25, g * 1000000.000000000000001, g / 8.0,
                   timestamptz '2026-01-01 00:00+00' + g * interval '1 minute 1.5 s',
                   timestamp '0001-01-01 00:00' + g * interval '100 days', DATE '9999-12-31' - g,
                   jsonb_build_object('n', g, 'tags', jsonb_build_array('x', g % 3 = 0), 'v', g / 4.0),
                   decode(lpad(to_hex(g), 8, '0'), 'hex'), md5(g::text)::uuid,
                   CASE WHEN g % 5 = 0 THEN NULL ELSE ARRAY['a' || g, 'b'] END, g % 3 = 0, g / 7.0
            FROM generate_series(1, 150) g;
        INSERT INTO accounts (id, name) VALUES (1000, 'all null');
        INSERT INTO ledger (account, delta, note)
            SELECT g % 20, g % 11 - 5, CASE WHEN g % 9 = 0 THEN NULL ELSE 'entry ' || g END
            FROM generate_series(1, 300) g;
        CREATE TABLE keyless (a int, b text, tags int[]);
        ALTER TABLE keyless REPLICA IDENTITY FULL;
        INSERT INTO keyless SELECT g % 6, CASE WHEN g % 4 = 0 THEN NULL ELSE 'dup' END, ARRAY[g % 2]
            FROM generate_series(1, 30) g;
        CREATE TABLE tagged (k int[], s text, v int, doc text, PRIMARY KEY (k, s));
        ALTER TABLE tagged ALTER COLUMN doc SET STORAGE EXTERNAL;
        INSERT INTO tagged VALUES ('{}', 'a', 0, NULL), ('{1,2}', 'a', 1, NULL), ('{2,1}', 'a', 2, NULL),
                                  ('{1,2}', 'b', 3, NULL), ('{1}', 'a', 4, NULL),
                                  ('{7}', 'big', 5,
                                   (SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g));
        CREATE PUBLICATION pub FOR TABLE accounts, ledger, keyless, tagged;
        """
    )
    dataset = dataset_for(db, "mixed")
    config = pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination=bigquery_destination(emulator, dataset),
        batch={"max_fill_ms": 300},
    )
    pipeline = start_pipeline(config)
    try:
        wait_until(lambda: all_ready(pipeline, 4), "tables ready", pipeline, timeout=240)
        wait_equal(db, emulator, dataset, TABLES, pipeline)

        # One transaction over both tables: inserts, updates (also of the key), deletes.
        db.execute(
            """
            BEGIN;
            INSERT INTO accounts VALUES (2001, 'new', 10.00, 0.000000000000001, 1e-30, now(), '2026-02-03 04:05',
                                         '2027-02-01', '{"deep": {"list": [1, 2.5, null, "s"]}}', '\\x00ff',
                                         gen_random_uuid(), ARRAY['with space', '', 'é'], true, 'Infinity'),
                                        (2002, 'new 2', NULL, NULL, NULL, NULL, NULL, NULL, 'null', '', NULL, '{}',
                                         NULL, NULL);
            UPDATE accounts SET balance = balance + 1, updated = updated + interval '1 day',
                                doc = doc || '{"changed": true}' WHERE id % 10 = 0;
            UPDATE accounts SET id = id + 100000, name = 'moved ' || id WHERE id % 17 = 0;
            DELETE FROM accounts WHERE id BETWEEN 40 AND 50;
            INSERT INTO ledger (account, delta, note) SELECT g, 1, 'late' FROM generate_series(1, 30) g;
            UPDATE ledger SET note = 'in tx' WHERE id % 7 = 0;
            INSERT INTO tagged VALUES ('{3,3}', 'a', 6, 'new'), ('{}', 'b', 7, NULL);
            UPDATE tagged SET v = v + 10 WHERE k = '{1,2}';
            UPDATE tagged SET k = '{2,1,0}' WHERE k = '{2,1}' AND s = 'a';
            UPDATE tagged SET s = 'moved' WHERE k = '{1}';
            DELETE FROM tagged WHERE k = '{}' AND s = 'a';
            COMMIT;
            """
        )
        db.execute("UPDATE ledger SET delta = delta * 100 WHERE id % 3 = 0")
        db.execute("DELETE FROM ledger WHERE id % 11 = 0")
        db.execute("UPDATE accounts SET tags = ARRAY['x'], ref = NULL WHERE id = 1")
        db.execute("UPDATE accounts SET id = 777777, exact = 123456789012345678901234567890.5 WHERE id = 77")
        db.execute("UPDATE accounts SET name = 'after move' WHERE id = 777777")
        db.execute("DELETE FROM accounts WHERE id = 1000")
        # An array key (no = in BigQuery): a key changed back, a key-only delete, an unchanged TOAST value.
        db.execute("UPDATE tagged SET k = '{1}' WHERE s = 'moved'")
        db.execute("DELETE FROM tagged WHERE k = '{1,2}' AND s = 'b'")
        db.execute("UPDATE tagged SET v = 50 WHERE s = 'big'")
        # A table without a key: identical rows keep their multiplicity.
        db.execute("DELETE FROM keyless WHERE ctid IN (SELECT ctid FROM keyless WHERE a = 1 LIMIT 1)")
        db.execute("UPDATE keyless SET b = 'changed' WHERE a = 2")
        db.execute("INSERT INTO keyless VALUES (9, NULL, NULL), (9, NULL, NULL)")
        wait_equal(db, emulator, dataset, TABLES, pipeline)

        # Truncate, rows after it in the same stream, and a column added at the source.
        db.execute("TRUNCATE ledger, keyless")
        db.execute("INSERT INTO ledger (account, delta, note) VALUES (1, 1, 'after truncate')")
        db.execute("INSERT INTO keyless VALUES (1, 'back', '{1}'), (1, 'back', '{1}')")
        # Older rows hold a column's constant default (Postgres's missing value, never streamed), of each kind.
        db.execute(
            """ALTER TABLE accounts ADD COLUMN tier text, ADD COLUMN level int NOT NULL DEFAULT 0,
                   ADD COLUMN motto text DEFAULT 'x, "y'' \\ é',
                   ADD COLUMN since timestamptz DEFAULT '2020-01-01 10:00+02',
                   ADD COLUMN wall timestamp DEFAULT '1999-12-31 23:59:59.5', ADD COLUMN fee numeric(6,2) DEFAULT 1.5,
                   ADD COLUMN flag boolean DEFAULT true, ADD COLUMN ratio float8 DEFAULT 0.1,
                   ADD COLUMN day date DEFAULT '2024-02-29', ADD COLUMN raw bytea DEFAULT '\\x00ff',
                   ADD COLUMN meta jsonb DEFAULT '{"a": [1, 2.50]}', ADD COLUMN marks int[] DEFAULT '{1}'"""
        )
        db.execute("UPDATE accounts SET tier = 'gold' WHERE id < 30")
        wait_equal(db, emulator, dataset, TABLES, pipeline)
        ledger, _ = bigquery_rows(emulator, dataset, "public.ledger")
        assert [r["note"] for r in ledger] == ["after truncate"]
    finally:
        pipeline.shutdown()

    # The values themselves, not only their equality with psycopg's reading: BigQuery types and a few spot checks.
    rows, schema = bigquery_rows(emulator, dataset, "public.accounts")
    types = {f.name: (f.field_type, f.mode) for f in schema}
    assert types["balance"] == ("NUMERIC", "NULLABLE")
    assert types["big"] == ("BIGNUMERIC", "NULLABLE")
    assert types["exact"] == ("STRING", "NULLABLE")
    assert types["updated"][0] == "TIMESTAMP" and types["local"][0] == "DATETIME"
    assert types["doc"][0] == "JSON" and types["blob"][0] == "BYTES" and types["tags"] == ("STRING", "REPEATED")
    new = next(r for r in rows if r["id"] == 2001)
    assert new["doc"] == {"deep": {"list": [1, 2.5, None, "s"]}}
    assert new["blob"] == b"\x00\xff" and new["tags"] == ["with space", "", "é"] and new["score"] == float("inf")
    assert new["big"] == Decimal("1e-15") and new["local"] == dt.datetime(2026, 2, 3, 4, 5)
    moved = next(r for r in rows if r["id"] == 777777)
    assert moved["name"] == "after move" and Decimal(moved["exact"]) == Decimal("123456789012345678901234567890.5")


# -- values and columns BigQuery cannot hold -----------------------------------------------------------------


@pytest.mark.slow
def test_what_bigquery_cannot_hold_errors_its_table_only(
    pg_database: TestDatabase, bigquery_emulator: BigQueryEmulator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Out-of-range values (in the copy, while streaming) and a column without a BigQuery type (``numeric[]``,
    added while streaming) error their own table with a message naming the column; ``date[]`` is an
    ``ARRAY<DATE>``; the other tables keep streaming."""
    db, emulator = pg_database, bigquery_emulator
    db.execute(
        """
        CREATE TABLE good (id int PRIMARY KEY, v text);
        CREATE TABLE bad_copy (id int PRIMARY KEY, at timestamptz);
        CREATE TABLE bad_stream (id int PRIMARY KEY, day date);
        CREATE TABLE dated (id int PRIMARY KEY, days date[]);
        CREATE TABLE amounts (id int PRIMARY KEY, v int);
        INSERT INTO good VALUES (1, 'x');
        INSERT INTO bad_copy VALUES (1, now()), (2, 'infinity');
        INSERT INTO bad_stream VALUES (1, '2026-01-01');
        INSERT INTO dated VALUES (1, ARRAY[DATE '2026-01-01', DATE '0001-01-01']), (2, '{}'), (3, NULL);
        INSERT INTO amounts VALUES (1, 1);
        CREATE PUBLICATION pub FOR TABLE good, bad_copy, bad_stream, dated, amounts;
        """
    )
    dataset = dataset_for(db, "limits")
    config = pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination=bigquery_destination(emulator, dataset),
    )
    pipeline = start_pipeline(config)
    states = pipeline.states
    assert states is not None

    def kind(table: str) -> TableStateKind | None:
        state = states.get(int(db.execute("SELECT %s::regclass::oid", (table,))[0][0]))
        return state.kind if state is not None else None

    streaming = ("good", "bad_stream", "dated", "amounts")
    try:
        wait_until(lambda: kind("bad_copy") is TableStateKind.ERRORED, "bad_copy errored in its copy", pipeline, 240)
        wait_until(lambda: all(kind(t) is TableStateKind.READY for t in streaming), "others ready", pipeline, 240)
        wait_equal(db, emulator, dataset, ("public.good", "public.dated"), pipeline)
        db.execute("INSERT INTO bad_stream VALUES (2, '-infinity'); INSERT INTO good VALUES (2, 'y')")
        db.execute("INSERT INTO dated VALUES (4, ARRAY[DATE '9999-12-31']); UPDATE dated SET days = '{}' WHERE id = 1")
        db.execute("ALTER TABLE amounts ADD COLUMN prices numeric[]")
        db.execute("INSERT INTO amounts VALUES (2, 2, ARRAY[1.5]); INSERT INTO good VALUES (3, 'z')")
        errored = ("bad_stream", "amounts")
        wait_until(lambda: all(kind(t) is TableStateKind.ERRORED for t in errored), "bad tables errored", pipeline, 240)
        db.execute("INSERT INTO good VALUES (4, 'w'); UPDATE good SET v = 'x2' WHERE id = 1")
        wait_equal(db, emulator, dataset, ("public.good", "public.dated"), pipeline)
        assert kind("good") is TableStateKind.READY and kind("dated") is TableStateKind.READY
    finally:
        pipeline.shutdown()

    # Nothing of the refused batch reached bad_stream; dated's column is an array of dates.
    stream_rows, _ = bigquery_rows(emulator, dataset, "public.bad_stream")
    assert stream_rows == [{"id": 1, "day": dt.date(2026, 1, 1)}]
    _, schema = bigquery_rows(emulator, dataset, "public.dated")
    assert {f.name: (f.field_type, f.mode) for f in schema}["days"] == ("DATE", "REPEATED")

    # What ``etl status`` prints for the pipeline, from its store.
    cmd_status(config, "test")
    printed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("public.")}
    assert "outside BigQuery's range" in printed["public.bad_copy"] and "column at" in printed["public.bad_copy"]
    assert "outside BigQuery's range" in printed["public.bad_stream"] and "column day" in printed["public.bad_stream"]
    assert "column prices is numeric[]" in printed["public.amounts"], printed
    assert printed["public.good"].split()[1] == "ready", printed


# -- a large copy: read and staged by Spark's tasks, one load job and one statement per copy or chunk --------------

MILLION = 1_000_000
CHUNK_ROWS = 250_000


@pytest.mark.slow
@pytest.mark.first_major
@pytest.mark.parametrize("method", ["snapshot", "incremental"])
def test_a_million_rows_copy_by_spark_tasks_in_one_load_and_one_insert_per_copy_or_chunk(
    pg_database: TestDatabase, bigquery_emulator: BigQueryEmulator, tmp_path: Path, method: str
) -> None:
    """No copied row passes the driver (the destination's own count of the rows it staged there stays 0), and the
    server's job list holds one load job and one statement inserting into the table per copy, or per chunk."""
    db, emulator = pg_database, bigquery_emulator
    db.execute(
        f"""
        CREATE TABLE big (id bigint PRIMARY KEY, note text, amount numeric(12,2));
        INSERT INTO big SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE 'n' || g END, g / 8.0
            FROM generate_series(1, {MILLION}) g;
        ANALYZE big;
        CREATE PUBLICATION pub FOR TABLE big;
        """
    )
    dataset = dataset_for(db, f"million_{method}")
    config = pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination=bigquery_destination(emulator, dataset),
        copy={"method": method, "chunk_rows": CHUNK_ROWS},
    )
    pipeline = start_pipeline(config)
    try:
        wait_until(lambda: all_ready(pipeline, 1), "the table ready", pipeline, timeout=400)
        registry = pipeline.metrics.registry
        on_driver = registry.get_sample_value("etl_bigquery_copied_rows_total", {"on": "driver"}) or 0.0
        by_spark = registry.get_sample_value("etl_bigquery_copied_rows_total", {"on": "spark"})
    finally:
        pipeline.shutdown()
    assert (on_driver, by_spark) == (0, MILLION)
    client = emulator.client()
    try:
        path = f"{PROJECT}.{dataset}.{table_id(TableName.parse('public.big'))}"
        jobs = list(client.list_jobs(all_users=True))
        loads = [j for j in jobs if j.job_type == "load" and j.destination.dataset_id == dataset]
        inserts = [j for j in jobs if j.job_type == "query" and f"INSERT INTO `{path}`" in j.query]
        stored = client.list_rows(path).to_arrow(create_bqstorage_client=False).to_pylist()
    finally:
        client.close()  # type: ignore[no-untyped-call]
    copies = 1 if method == "snapshot" else MILLION // CHUNK_ROWS
    assert (len(loads), len(inserts)) == (copies, copies)
    with db.connect() as conn:
        expected = conn.execute("SELECT id, note, amount FROM big ORDER BY id").fetchall()
    assert sorted(tuple(r.values()) for r in stored) == expected


# -- quota use: one load job per batch, at most one apply per table and interval ---------------------------

APPLY_INTERVAL_S = 8


def apply_jobs(emulator: BigQueryEmulator, dataset: str, oids: dict[str, int]) -> dict[str, int]:
    """Per table, the query jobs that applied a batch to it (their script ends by advancing its watermark)."""
    client = emulator.client()
    try:
        scripts = [
            job.query
            for job in client.list_jobs(all_users=True)
            if job.job_type == "query"
            and f"{dataset}._etl_watermarks" in job.query
            and "COMMIT TRANSACTION" in job.query
        ]
    finally:
        client.close()  # type: ignore[no-untyped-call]
    return {table: sum(f"table_oid = {oid}" in s for s in scripts) for table, oid in oids.items()}


@pytest.mark.slow
@pytest.mark.first_major
def test_ten_tables_at_one_second_batches_use_one_load_per_batch_and_pace_the_applies(
    pg_database: TestDatabase, bigquery_emulator: BigQueryEmulator, tmp_path: Path
) -> None:
    """A minute of transactions over ten tables, five a second: staging grows with the batches, not with
    batches x tables, and no table is applied more often than ``min_apply_interval_s`` allows."""
    db, emulator = pg_database, bigquery_emulator
    tables = tuple(f"public.q{i}" for i in range(10))
    for table in tables:
        db.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
        db.execute(f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 10) g")
    db.execute(f"CREATE PUBLICATION pub FOR TABLE {', '.join(tables)}")
    oids = {t: int(db.execute(f"SELECT '{t}'::regclass::oid")[0][0]) for t in tables}
    dataset = dataset_for(db, "quota")
    config = pipeline_config(
        db,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination=bigquery_destination(emulator, dataset) | {"min_apply_interval_s": APPLY_INTERVAL_S},
        batch={"max_fill_ms": 1000},
    )
    pipeline = start_pipeline(config)
    registry = pipeline.metrics.registry

    def loads() -> float:
        return registry.get_sample_value("etl_bigquery_load_jobs_total", {"table": "*"}) or 0.0

    def batches() -> float:
        return registry.get_sample_value("etl_batch_write_seconds_count", {"destination": "bigquery"}) or 0.0

    def settled() -> tuple[float, float, dict[str, int]]:
        """Loads, batches and applies once they hold still for a second: a batch shows in the dataset before
        its write returns and is counted."""
        readings = [(loads(), batches(), apply_jobs(emulator, dataset, oids))]

        def still() -> bool:
            time.sleep(1)
            readings.append((loads(), batches(), apply_jobs(emulator, dataset, oids)))
            return readings[-1] == readings[-2]

        wait_until(still, "the counts to settle", pipeline)
        return readings[-1]

    try:
        wait_until(lambda: all_ready(pipeline, len(tables)), "tables ready", pipeline, timeout=240)
        wait_equal(db, emulator, dataset, tables, pipeline)
        loads_before, batches_before, applies_before = settled()
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < 60:
            n += 1
            db.execute(
                "BEGIN; "
                + " ".join(f"UPDATE {t} SET v = v + 1 WHERE id = {n % 10 + 1};" for t in tables)
                + f" INSERT INTO {tables[n % 10]} VALUES ({n + 100}, {n}); COMMIT"
            )
            time.sleep(max(0.0, started + n * 0.2 - time.monotonic()))  # on a schedule, however slow the writes
        wait_equal(db, emulator, dataset, tables, pipeline)
        window = time.monotonic() - started
        loads_after, batches_after, applies = settled()
    finally:
        pipeline.shutdown()
    staged, written = loads_after - loads_before, batches_after - batches_before
    per_table = {t: applies[t] - applies_before[t] for t in tables}
    allowed = window / APPLY_INTERVAL_S + 1
    # the premise: a transaction at least every half second, so unpaced 1 s batches would be due every second
    assert n >= 120
    assert 2 <= staged <= written  # one load job per batch written, whatever the number of tables it carries
    assert set(per_table.values()) == {staged}  # each batch applied every table once, in one transaction
    assert staged <= allowed  # batches due faster were merged


@pytest.mark.slow
@pytest.mark.first_major
def test_a_dataset_without_the_copied_tables_stops_the_start(
    pg_database: TestDatabase, bigquery_emulator: BigQueryEmulator, tmp_path: Path
) -> None:
    """A dataset deleted (or another one named) while the store says tables were copied stops the start: the
    pipeline never recreates them empty and moves the store's progress past the copied rows."""
    db = pg_database
    db.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'copied' FROM generate_series(1, 20) g"
    )
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    dataset = dataset_for(db, "lost")

    def config(name: str) -> PipelineConfig:
        return pipeline_config(
            db,
            store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
            destination=bigquery_destination(bigquery_emulator, name),
        )

    pipeline = start_pipeline(config(dataset))
    try:
        wait_until(lambda: all_ready(pipeline, 1), "the copy", pipeline, timeout=180)
    finally:
        pipeline.shutdown()
    client = bigquery_emulator.client()
    try:
        client.delete_dataset(f"{PROJECT}.{dataset}", delete_contents=True)
    finally:
        client.close()  # type: ignore[no-untyped-call]
    db.execute("INSERT INTO t VALUES (21, 'streamed later')")
    store = build_store(config(dataset), "test")
    before = store.get_progress(APPLY_WORKER)
    store.close()

    for name in (dataset, dataset_for(db, "other")):
        with pytest.raises(DestinationError, match="has no table for 1 of the 1 tables") as error:
            start_pipeline(config(name))
        assert "etl reset --recopy" in (error.value.hint or "")
    store = build_store(config(dataset), "test")
    assert store.get_progress(APPLY_WORKER) == before, "the store's progress stayed where it was"
    store.close()
