"""The SQLite store: the durable store contract, migrations, bad files, the file lock, busy waiting."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from etl.config import load_config
from etl.errors import StoreError
from etl.factory import build_store
from etl.lsn import Lsn
from etl.plugins import load_registry
from etl.store.base import APPLY_WORKER, CopyProgress, TableState, TableStateKind
from etl.store.cached import STATE_HISTORY_LIMIT
from etl.store.migrations import MIGRATIONS, Migration
from etl.testing.store_contract import ConcurrentStoreContract
from etl_store_sqlite import SqliteStore


class TestSqliteStoreContract(ConcurrentStoreContract):
    store_class = SqliteStore

    @pytest.fixture
    def store_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"path": str(tmp_path / "state.db")}


def test_registered_as_the_sqlite_store() -> None:
    assert load_registry().store("sqlite") is SqliteStore


def test_config_keys() -> None:
    config = SqliteStore.Config.model_validate({"path": "s.db", "busy_timeout_ms": 250})
    assert (config.path, config.busy_timeout_ms) == (Path("s.db"), 250)
    assert SqliteStore.Config.model_validate({"path": "s.db"}).busy_timeout_ms == 5000


def test_file_is_in_wal_mode_and_marked_as_an_etl_store(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SqliteStore(path, 1).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA application_id").fetchone() == (0x45544C31,)
        assert conn.execute("SELECT version FROM etl_store_version").fetchall() == [(m.version,) for m in MIGRATIONS]


def test_random_bytes_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(StoreError, match="is not a SQLite database or is corrupt") as caught:
        SqliteStore(path, 1)
    assert str(path) in caught.value.message
    assert caught.value.hint and "path" in caught.value.hint


def test_another_programs_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE etl_table_states (id integer primary key, name text)")
        conn.execute("INSERT INTO etl_table_states VALUES (1, 'x')")
    conn.close()
    with pytest.raises(StoreError, match="another program, not an etl store"):
        SqliteStore(path, 1)
    with sqlite3.connect(path) as conn:
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        assert (tables, conn.execute("PRAGMA application_id").fetchone()) == ([("etl_table_states",)], (0,))
    conn.close()


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open the SQLite store file") as caught:
        SqliteStore(tmp_path / "no" / "such" / "state.db", 1)
    assert caught.value.hint and "directory exists" in caught.value.hint


def _add_table(conn: sa.Connection, schema: str | None) -> None:
    conn.exec_driver_sql("CREATE TABLE etl_future (x integer)")


def _fail(conn: sa.Connection, schema: str | None) -> None:
    conn.exec_driver_sql("CREATE TABLE etl_half_done (x integer)")
    raise sa.exc.OperationalError("step 3", {}, sqlite3.OperationalError("migration step failed"))


NEXT = MIGRATIONS[-1].version + 1


class FutureSqliteStore(SqliteStore):
    """The store as a later release with one more migration would be."""

    migrations = (*MIGRATIONS, Migration(NEXT, "a future table", _add_table))


def test_migrations_upgrade_an_older_file_and_an_older_release_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path, 1)
    store.update_table_states({1: TableState(TableStateKind.READY)})
    store.close()

    upgraded = FutureSqliteStore(path, 1)
    assert upgraded.get_table_state(1) == TableState(TableStateKind.READY)
    upgraded.close()
    with sqlite3.connect(path) as conn:
        versions = conn.execute("SELECT version FROM etl_store_version ORDER BY version").fetchall()
        assert versions == [(m.version,) for m in FutureSqliteStore.migrations]
    conn.close()

    with pytest.raises(StoreError, match="was written by a newer etl-store-sqlite") as caught:
        SqliteStore(path, 1)
    assert f"version {NEXT}" in caught.value.message
    assert caught.value.hint == "upgrade the package: pip install --upgrade etl-store-sqlite"


def test_a_file_of_the_first_release_gains_the_resync_requests(tmp_path: Path) -> None:
    class FirstReleaseStore(SqliteStore):
        migrations = MIGRATIONS[:1]

    path = tmp_path / "state.db"
    first = FirstReleaseStore(path, 1)
    first.update_table_states({1: TableState(TableStateKind.READY)})
    first.close()
    store = SqliteStore(path, 1)
    store.request_resync(1)
    assert store.get_table_state(1) == TableState(TableStateKind.READY)
    assert store.take_resync_requests() == {1: None}
    store.close()


def test_a_file_of_the_fifth_release_gains_backfill_predicates(tmp_path: Path) -> None:
    class FifthReleaseStore(SqliteStore):
        migrations = MIGRATIONS[:5]

    path = tmp_path / "state.db"
    fifth = FifthReleaseStore(path, 1)
    fifth.request_resync(1)
    with pytest.raises(StoreError, match="cannot take a --where predicate"):
        fifth.request_resync(2, where="id < 10")
    assert fifth.take_resync_requests() == {1: None}
    fifth.request_resync(1)
    fifth.close()
    store = SqliteStore(path, 1)
    store.request_resync(2, where="id < 10")
    assert store.take_resync_requests() == {1: None, 2: "id < 10"}, "the request made before the upgrade stays"
    store.close()


def test_a_file_of_the_second_release_gains_the_copy_progress(tmp_path: Path) -> None:
    class SecondReleaseStore(SqliteStore):
        migrations = MIGRATIONS[:2]

    path = tmp_path / "state.db"
    second = SecondReleaseStore(path, 1)
    second.update_table_states({1: TableState(TableStateKind.DATA_SYNC)})
    second.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'etl_copy_progress'").fetchall() == []
    conn.close()
    store = SqliteStore(path, 1)
    progress = CopyProgress(5, 10, datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, 0, 0, 1, tzinfo=UTC))
    store.record_copy_progress(1, progress)
    store.close()
    reopened = SqliteStore(path, 1)
    assert (reopened.get_table_state(1), reopened.get_copy_progress(1)) == (
        TableState(TableStateKind.DATA_SYNC),
        progress,
    )
    reopened.close()
    with sqlite3.connect(path) as conn:
        versions = conn.execute("SELECT version, description FROM etl_store_version ORDER BY version").fetchall()
    conn.close()
    assert versions[2:] == [
        (3, "copy progress"),
        (4, "table activity"),
        (5, "incremental copy position"),
        (6, "backfill predicates"),
    ]


def test_copy_progress_of_the_fourth_release_gains_an_incremental_position(tmp_path: Path) -> None:
    class FourthReleaseStore(SqliteStore):
        migrations = MIGRATIONS[:4]

    path = tmp_path / "state.db"
    progress = CopyProgress(5, 10, datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, 0, 0, 1, tzinfo=UTC))
    fourth = FourthReleaseStore(path, 1)
    fourth.record_copy_progress(1, progress)
    fourth.close()
    store = SqliteStore(path, 1)
    assert store.get_copy_progress(1) == progress  # resume_after: None, as a snapshot copy has
    resumable = replace(progress, rows=7, resume_after='{"after": 7}')
    store.record_copy_progress(1, resumable)
    store.close()
    reopened = SqliteStore(path, 1)
    assert reopened.get_copy_progress(1) == resumable
    reopened.close()


def test_a_failing_migration_changes_nothing(tmp_path: Path) -> None:
    class BrokenSqliteStore(SqliteStore):
        migrations = (*MIGRATIONS, Migration(NEXT, "breaks half-way", _fail))

    path = tmp_path / "state.db"
    with pytest.raises(StoreError, match="migration step failed"):
        BrokenSqliteStore(path, 1)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []
        assert conn.execute("PRAGMA application_id").fetchone() == (0,)
    conn.close()
    SqliteStore(path, 1).close()  # the file is still a fresh start


def test_history_is_trimmed_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = SqliteStore(path, 1)
    for lsn in range(STATE_HISTORY_LIMIT + 7):
        store.update_table_states({1: TableState(TableStateKind.SYNC_DONE, Lsn(lsn))})
    store.close()
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT min(seq), max(seq), count(*) FROM etl_table_states").fetchone()
    conn.close()
    assert rows == (8, STATE_HISTORY_LIMIT + 7, STATE_HISTORY_LIMIT)


def _hold_write_lock(path: Path, seconds: float, started: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    started.set()
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


def test_writes_wait_for_another_writer_up_to_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    patient = SqliteStore.from_config({"path": str(path), "busy_timeout_ms": 10_000}, 1)
    impatient = SqliteStore.from_config({"path": str(path), "busy_timeout_ms": 0}, 2)
    for store, lsn in ((impatient, 1), (patient, 2)):
        started = threading.Event()
        writer = threading.Thread(target=_hold_write_lock, args=(path, 0.5, started))
        writer.start()
        started.wait()
        try:
            if store is impatient:
                with pytest.raises(StoreError, match="database is locked"):
                    store.upsert_progress(APPLY_WORKER, Lsn(lsn))
                assert store.get_progress(APPLY_WORKER) is None  # a failed write leaves the cache alone
            else:
                assert store.upsert_progress(APPLY_WORKER, Lsn(lsn)) == lsn
        finally:
            writer.join()
    patient.close()
    impatient.close()


def test_chosen_by_the_pipeline_file(tmp_path: Path) -> None:
    pipeline_file = tmp_path / "pipeline.toml"
    pipeline_file.write_text(
        f"""
[pipeline]
id = 4
publication = "pub"

[source]
database = "app"

[store]
type = "sqlite"
path = "{tmp_path / "state.db"}"
busy_timeout_ms = 1000
"""
    )
    store = build_store(load_config(pipeline_file), str(pipeline_file))
    assert isinstance(store, SqliteStore) and store.pipeline_id == 4
    store.upsert_progress(APPLY_WORKER, Lsn(9))
    store.close()
    assert SqliteStore(tmp_path / "state.db", 4).get_progress(APPLY_WORKER) == 9


def test_preflight_fails_when_the_files_directory_is_missing(tmp_path: Path) -> None:
    (check,) = SqliteStore.preflight(SqliteStore.Config(path=tmp_path / "missing" / "state.sqlite"))
    assert not check.ok
    assert check.detail == f"the directory {tmp_path / 'missing'} does not exist"
    assert check.fix and f"mkdir -p {tmp_path / 'missing'}" in check.fix


def test_preflight_passes_a_file_to_create_and_creates_nothing(tmp_path: Path) -> None:
    (check,) = SqliteStore.preflight(SqliteStore.Config(path=tmp_path / "state.sqlite"))
    assert check.ok, check.detail
    assert list(tmp_path.iterdir()) == []


def test_preflight_fails_when_the_path_is_a_directory(tmp_path: Path) -> None:
    (check,) = SqliteStore.preflight(SqliteStore.Config(path=tmp_path))
    assert not check.ok
    assert check.detail == f"{tmp_path} is not a file"
