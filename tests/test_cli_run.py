"""`etl run`, `etl status` and `etl resync` as processes: signals, the pipeline lock, status output; and the
resync request as embedding code makes it."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from etl.config import load_config
from etl.errors import EtlError
from etl.factory import build_store
from etl.pipeline import request_resync
from etl.schema import TableName
from etl.store.base import TableStateKind
from etl.testing.pipelines import pipeline_config, poll
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config


def write_pipeline(tmp_path: Path, db: TestDatabase) -> Path:
    config = pipeline_config(
        db,
        pipeline_id=3,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={"type": "null"},
    )
    return write_config(tmp_path / "p.toml", config)


def etl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "etl.cli", *args], capture_output=True, text=True, timeout=120, check=False
    )


def wait_for_status(config: Path, text: str, timeout: float = 60) -> str:
    return poll(
        lambda: etl("status", "-c", str(config)).stdout,
        f"status showing {text!r}",
        until=lambda out: text in out,
        timeout=timeout,
        least=0.5,
    )


@pytest.fixture
def source(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'x' FROM generate_series(1, 100) g"
    )
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    return pg_database


def test_run_status_lock_and_sigterm(source: TestDatabase, tmp_path: Path) -> None:
    config = write_pipeline(tmp_path, source)
    with PipelineProcess(config, log_level="info") as run:
        run.start()
        out = wait_for_status(config, "ready")
        assert "public.t" in out and "etl_apply_3" in out

        second = etl("run", "-c", str(config))
        assert second.returncode == 1
        assert "pipeline 3" in second.stderr and "already" in second.stderr.lower()

        source.execute("INSERT INTO t VALUES (101, 'y')")
        out = wait_for_status(config, "1 ins, 0 upd, 0 del")  # what the run streamed, not what it copied
        assert "UTC (" in out and " ago)" in out  # the last write's time
        source.execute("UPDATE t SET v = 'z' WHERE id <= 2; DELETE FROM t WHERE id = 3")
        # Durable (the slot confirmed it) within the interval of the last record: only the stop records it. The
        # insert position, not the write position: the test clusters commit asynchronously, so the WAL written so
        # far may end before the commit just made, and a slot confirmed up to it would not have the update yet.
        ((end,),) = source.execute("SELECT pg_current_wal_insert_lsn()")

        def durable() -> bool:
            run.ensure_alive()
            query = "SELECT confirmed_flush_lsn >= %s FROM pg_replication_slots WHERE slot_name = 'etl_apply_3'"
            return bool(source.execute(query, (end,))[0][0])

        poll(durable, "the update to become durable", timeout=60, least=0.1)
        run.stop()
    stderr = run.output()
    assert "draining the batch in flight" in stderr and "pipeline stopped" in stderr

    shown = json.loads(etl("status", "-c", str(config), "--format", "json").stdout)
    (table,) = shown["tables"]
    activity = table["activity"]
    assert (activity["inserts"], activity["updates"], activity["deletes"], activity["truncates"]) == (1, 2, 1, 0)
    assert datetime.fromisoformat(activity["since"]) <= datetime.fromisoformat(activity["last_write_at"])
    status = etl("status", "-c", str(config))
    assert status.returncode == 0
    line = next(x for x in status.stdout.splitlines() if x.startswith("apply worker durable progress"))
    assert line.split(":")[1].strip() not in ("none", "")
    slot = source.execute("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'etl_apply_3'")
    assert slot and slot[0][0] is not None


def test_resync_rejects_a_table_outside_the_publication(source: TestDatabase, tmp_path: Path) -> None:
    config = write_pipeline(tmp_path, source)
    result = etl("resync", "-c", str(config), "--table", "public.nope")
    assert result.returncode == 1
    assert "not in publication 'pub'" in result.stderr and "public.t" in result.stderr
    assert not (tmp_path / "state.sqlite").exists()  # the store is not opened (created, migrated) for nothing


@pytest.mark.parametrize(
    ("where", "said"),
    [
        ("id < 10; DROP TABLE t", "the --where predicate holds a ';'"),
        ("id < 10) OR (true", "closes a parenthesis it did not open"),
        ("v = 'x' /* no end", "is not valid SQL"),
        ("nope > 1", 'does not fit public.t: column "nope" does not exist'),
        ("id + 1", "does not fit public.t: argument of WHERE must be type boolean"),
        ("pg_terminate_backend(pg_backend_pid())", "calls what is volatile: function pg_catalog.pg_terminate_backend"),
        ("   ", "the --where predicate is empty"),
    ],
)
def test_resync_refuses_a_predicate_before_it_reaches_the_store(
    source: TestDatabase, tmp_path: Path, where: str, said: str
) -> None:
    """``--where`` is read by Postgres's lexer and planned on the source first: nothing is asked, no store opened,
    and the table is intact."""
    config = write_pipeline(tmp_path, source)
    result = etl("resync", "-c", str(config), "--table", "public.t", "--where", where)
    assert result.returncode == 1
    assert said in result.stderr, result.stderr
    assert not (tmp_path / "state.sqlite").exists()
    assert source.execute("SELECT count(*) FROM t") == [(100,)]


def test_a_backfill_needs_a_key(source: TestDatabase, tmp_path: Path) -> None:
    """Any key orders a backfill's chunks (a text one here); a table without one cannot have one."""
    source.execute(
        "CREATE TABLE k (a text PRIMARY KEY); CREATE TABLE n (a text); ALTER TABLE n REPLICA IDENTITY FULL;"
        " ALTER PUBLICATION pub ADD TABLE k, n"
    )
    config = write_pipeline(tmp_path, source)
    result = etl("resync", "-c", str(config), "--table", "public.n", "--where", "a > 'm'")
    assert result.returncode == 1
    assert "--where needs a table with a key to copy its rows in chunks by; public.n: it has no primary key" in (
        result.stderr
    )
    assert "etl resync --table public.n" in result.stderr  # the hint: the whole table instead
    result = etl("resync", "-c", str(config), "--table", "public.k", "--where", "a > 'm'")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_resync_reaches_the_running_pipeline_through_the_store(source: TestDatabase, tmp_path: Path) -> None:
    config = write_pipeline(tmp_path, source)
    with PipelineProcess(config, log_level="info") as run:
        run.start()
        wait_for_status(config, "ready")
        assert run.output().count("table copied") == 1
        result = etl("resync", "-c", str(config), "--table", "public.t")
        assert result.returncode == 0, result.stderr
        assert "resync of public.t requested" in result.stdout

        def log() -> str:
            run.ensure_alive()
            return run.output()

        poll(log, "the table to be copied again", until=lambda out: out.count("table copied") >= 2, least=0.2)
        assert "why=requested" in run.output()
        wait_for_status(config, "ready")


def test_embedding_code_requests_a_resync_without_the_cli(source: TestDatabase, tmp_path: Path) -> None:
    config = pipeline_config(source, store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")})
    store = build_store(config, "test")
    try:
        table_id = request_resync(config, store, TableName("public", "t"))
        assert table_id == source.execute("SELECT 'public.t'::regclass::oid")[0][0]
        assert store.take_resync_requests() == {table_id: None}
        assert request_resync(config, store, TableName("public", "t"), "v LIKE 'x%'") == table_id
        assert store.take_resync_requests() == {table_id: "v LIKE 'x%'"}
        with pytest.raises(EtlError, match="not in publication 'pub'") as outside:
            request_resync(config, store, TableName("public", "nope"))
        assert "public.t" in (outside.value.hint or "")
        assert store.take_resync_requests() == {}
    finally:
        store.close()


def test_resync_refuses_the_memory_store(source: TestDatabase, tmp_path: Path) -> None:
    config = write_config(tmp_path / "p.toml", pipeline_config(source, destination={"type": "null"}))
    result = etl("resync", "-c", str(config), "--table", "public.t")
    assert result.returncode == 1
    assert "memory store lives inside the running pipeline's process" in result.stderr


def test_a_broken_java_stops_the_run_with_one_error_and_errors_no_table(
    source: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault of the process's environment is no table's fault: with JAVA_HOME pointing nowhere, `etl run`
    into DuckLake stops as it starts, with the Java error and its hint, instead of erroring each table and
    retrying it on a timer (or copying the small ones, which need no Spark, and failing later)."""
    config = pipeline_config(
        source,
        pipeline_id=3,
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={
            "type": "ducklake",
            "catalog": f"sqlite:///{tmp_path}/catalog.sqlite",
            "data_path": f"{tmp_path}/lake/",
            "spark": {"master": "local[1]"},
        },
    )
    path = write_config(tmp_path / "p.toml", config)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    result = etl("run", "-c", str(path))
    assert result.returncode != 0, result.stderr
    assert f"JAVA_HOME is set to {tmp_path / 'no-java'}" in result.stderr
    assert "point JAVA_HOME at a Java 17 or 21 installation" in result.stderr
    assert "table errored" not in result.stderr and "table sync failed" not in result.stderr
    store = build_store(load_config(path), str(path))
    try:
        assert not any(s.kind is TableStateKind.ERRORED for s in store.get_table_states().values())
    finally:
        store.close()
