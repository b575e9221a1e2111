"""``[copy]``: which tables are copied before they stream (``include``, ``skip``, ``mode = "never"``), and a run
that copies, then stops (``mode = "initial_only"``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from structlog.testing import capture_logs

from etl.checks import run_checks
from etl.destination.base import WriteResult
from etl.destination.memory import MemoryDestination
from etl.lsn import Lsn
from etl.pipeline import Pipeline
from etl.postgres.slot_state import SlotLostError
from etl.schema import TableSchema
from etl.store.base import TableStateKind
from etl.testing.compare import source_rows
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl_store_sqlite.store import SqliteStore

TABLES = ("public.a", "public.b", "public.c")


@pytest.fixture
def source(pg_database: TestDatabase) -> TestDatabase:
    for table in TABLES:
        pg_database.execute(
            f"CREATE TABLE {table} (id int PRIMARY KEY, v text);"
            f" INSERT INTO {table} SELECT g, 'before' FROM generate_series(1, 50) g"
        )
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE a, b, c")
    return pg_database


def start(db: TestDatabase, destination: MemoryDestination, state: Path, **copy: Any) -> Pipeline:
    store = SqliteStore(state, pipeline_id=1)
    pipeline = Pipeline(pipeline_config(db, copy=copy), store, destination)
    pipeline.start()
    return pipeline


def rows_after_start(db: TestDatabase, table: str) -> list[dict[str, Any]]:
    """The table's rows on the source that the workload wrote after the pipeline started (``v <> 'before'``)."""
    with db.connect() as conn:
        return [r for r in source_rows(conn, table) if r["v"] != "before"]


def workload(db: TestDatabase) -> None:
    for table in TABLES:
        db.execute(
            f"BEGIN; INSERT INTO {table} SELECT g, 'streamed' FROM generate_series(101, 110) g;"
            f" UPDATE {table} SET v = 'updated' WHERE id = 105; DELETE FROM {table} WHERE id = 110; COMMIT"
        )


def test_tables_left_out_of_the_copy_stream_from_the_start_and_a_resync_copies_them(
    source: TestDatabase, tmp_path: Path
) -> None:
    """``include`` picks a and b, ``skip`` takes b out again: a is copied; b and c start empty and get only what
    changes after the start. ``etl resync`` of b copies it all the same (it was taken on before)."""
    destination = MemoryDestination()
    pipeline = start(source, destination, tmp_path / "state.sqlite", include=["a", "public.b"], skip=["b"])
    try:
        wait_until(lambda: all_ready(pipeline, 3), "every table ready", pipeline)
        assert destination.rows("public.b") == destination.rows("public.c") == []
        workload(source)
        wait_until(lambda: destination_matches(source, destination, "public.a"), "a copied and streamed", pipeline)
        for table in ("public.b", "public.c"):
            wait_until(
                lambda t=table: destination.rows(t) == rows_after_start(source, t), f"{table} streamed", pipeline
            )
        assert len(destination.rows("public.c")) == 9  # ten inserted, one of them deleted: none of the 50 before

        with source.connect() as conn:
            b = int(conn.execute("SELECT 'public.b'::regclass::oid").fetchone()[0])  # type: ignore[index]
            slots = {r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()}
        assert slots == {"etl_apply_1"}  # no table-sync slot was made for b or c
        pipeline.resync(b)
        wait_until(lambda: destination_matches(source, destination, *TABLES[:2]), "b copied on request", pipeline)
        assert len(destination.rows("public.b")) == 59
    finally:
        pipeline.shutdown()


def test_mode_never_copies_no_table(source: TestDatabase, tmp_path: Path) -> None:
    destination = MemoryDestination()
    pipeline = start(source, destination, tmp_path / "state.sqlite", mode="never")
    try:
        wait_until(lambda: all_ready(pipeline, 3), "every table ready", pipeline)
        workload(source)
        for table in TABLES:
            wait_until(
                lambda t=table: destination.rows(t) == rows_after_start(source, t), f"{table} streamed", pipeline
            )
    finally:
        pipeline.shutdown()


class SlowToCreate(MemoryDestination):
    """The memory destination, taking a second to create table b, as a warehouse's DDL does."""

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        if str(schema.name) == "public.b":
            time.sleep(1)
        return super().write_table_rows(schema, rows)


def test_a_table_taken_on_without_a_copy_under_steady_writes_gets_whole_transactions(
    source: TestDatabase, tmp_path: Path
) -> None:
    """Transactions of two rows each commit all the while the pipeline takes b on (its destination table takes a
    second to create): every one that began after the position the table is streamed from is in the destination,
    and each is there whole or not at all."""
    stop, errors, began = threading.Event(), [], {}

    def write() -> None:
        try:
            with source.connect() as conn:
                n = 500
                while not stop.is_set():
                    began[2 * n] = Lsn.parse(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])
                    conn.execute("BEGIN")
                    conn.execute("INSERT INTO b VALUES (%s, 'new')", (2 * n,))
                    conn.execute("INSERT INTO b VALUES (%s, 'new')", (2 * n + 1,))
                    conn.execute("COMMIT")
                    n += 1
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    destination = SlowToCreate()
    try:
        pipeline = start(source, destination, tmp_path / "state.sqlite", skip=["b"])
        try:
            wait_until(lambda: all_ready(pipeline, 3), "every table ready", pipeline)
            time.sleep(0.5)
            stop.set()
            writer.join(30)
            source.execute("UPDATE b SET v = 'last' WHERE id = 1")
            wait_until(lambda: any(r["v"] == "last" for r in destination.rows("public.b")), "the last change", pipeline)
        finally:
            pipeline.shutdown()
    finally:
        stop.set()
        writer.join(30)
    assert not errors, errors
    store = SqliteStore(tmp_path / "state.sqlite", pipeline_id=1)
    b = store.get_table_schema(int(source.execute("SELECT 'public.b'::regclass::oid")[0][0]))
    store.close()
    assert b is not None and b.snapshot_lsn is not None
    ids = {r["id"] for r in destination.rows("public.b") if r["id"] >= 1000}
    assert ids == {i ^ 1 for i in ids}, "a transaction arrived in part"
    after = sorted(i for i, lsn in began.items() if lsn >= b.snapshot_lsn)
    assert after, "no transaction began after the table was taken on"
    assert [i for i in after if i not in ids] == [], "transactions after the position it streams from are missing"


def test_initial_only_copies_every_table_then_stops_and_drops_its_slot(source: TestDatabase, tmp_path: Path) -> None:
    """The run ends by itself once every table is copied, leaving no slot on the source; a later run of the same
    pipeline says its changes since are lost instead of streaming on past them."""
    destination = MemoryDestination()
    pipeline = start(source, destination, tmp_path / "state.sqlite", mode="initial_only", skip=["c"])
    try:
        assert pipeline.wait(timeout=120), "the run did not stop after the copies"
        states = pipeline.states.snapshot() if pipeline.states is not None else {}
    finally:
        pipeline.shutdown()
    assert {s.kind for s in states.values()} == {TableStateKind.READY}
    assert destination_matches(source, destination, "public.a", "public.b")
    assert destination.rows("public.c") == []
    with source.connect() as conn:
        assert conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall() == []

    source.execute("INSERT INTO a VALUES (1000, 'after the copy')")
    again = start(source, MemoryDestination(), tmp_path / "state.sqlite", mode="initial")
    try:
        with pytest.raises(SlotLostError, match="etl_apply_1"):
            again.wait(timeout=60)
    finally:
        again.shutdown()


def test_copy_names_outside_the_publication_fail_the_check_and_warn_at_the_start(
    source: TestDatabase, tmp_path: Path
) -> None:
    """A name of no published table is a typo, or a table dropped since: etl check fails on it, and a start
    warns (a skipped table that was dropped must not stop every later start)."""
    config = pipeline_config(source, copy={"include": ["a"], "skip": ["public.audit_log"]})
    checks = {c.name: c for c in run_checks(config)}
    assert checks["copy tables"].failed
    assert "public.audit_log" in checks["copy tables"].detail
    assert "ALTER PUBLICATION pub ADD TABLE" in (checks["copy tables"].fix or "")

    pipeline = Pipeline(config, SqliteStore(tmp_path / "state.sqlite", pipeline_id=1), MemoryDestination())
    with capture_logs() as logs:
        pipeline.start()
    try:
        warned = [e for e in logs if e["log_level"] == "warning" and "does not publish" in e["event"]]
        assert warned and "public.audit_log" in warned[0]["event"]
        wait_until(lambda: all_ready(pipeline, 3), "every table ready", pipeline)
    finally:
        pipeline.shutdown()
