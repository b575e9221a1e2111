from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from etl.checks import run_checks
from etl.postgres.ddl import install_ddl_trigger
from etl.preflight import Check
from etl.schema import quote_literal
from etl.status import status_report
from etl.store.base import TableState, TableStateKind
from etl.store.memory import MemoryStore
from etl.testing import TemporaryCluster, find_install
from etl.testing.pipelines import pipeline_config
from etl.testing.pytest_plugin import TestDatabase


def pipeline_file(tmp_path: Path, port: int, database: str, publication: str = "pub") -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(
        f'[pipeline]\nid = 7\npublication = "{publication}"\n'
        f'[source]\nhost = "127.0.0.1"\nport = {port}\ndatabase = "{database}"\n'
        'user = "postgres"\nsslmode = "disable"\n'
    )
    return path


def etl_check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "etl.cli", "check", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def replica_cluster(pg_major: int) -> Iterator[TemporaryCluster]:
    with TemporaryCluster(find_install(pg_major), {"wal_level": "replica"}) as cluster:
        yield cluster


def test_check_passes_on_a_correct_setup(pg_database: TestDatabase, tmp_path: Path) -> None:
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    result = etl_check(pipeline_file(tmp_path, pg_database.cluster.port, pg_database.name))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    assert "PASS  wal_level" in result.stdout


def test_check_fails_on_wal_level_replica_with_the_fix(replica_cluster: TemporaryCluster, tmp_path: Path) -> None:
    with replica_cluster.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    result = etl_check(pipeline_file(tmp_path, replica_cluster.port, "postgres"))
    assert result.returncode == 1
    line = next(line for line in result.stdout.splitlines() if "wal_level" in line)
    assert line.startswith("FAIL") and "'replica'" in line
    assert "ALTER SYSTEM SET wal_level = logical" in result.stdout


def test_check_names_missing_publication_unusable_identity_and_privileges(
    pg_database: TestDatabase, tmp_path: Path
) -> None:
    result = etl_check(pipeline_file(tmp_path, pg_database.cluster.port, pg_database.name, publication="nope"))
    assert result.returncode == 1
    assert "FAIL  publication: publication 'nope' does not exist" in result.stdout
    assert "CREATE PUBLICATION nope" in result.stdout

    pg_database.execute("CREATE TABLE keyless (v text)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE keyless")
    pg_database.execute("CREATE ROLE reader LOGIN")
    try:
        path = pipeline_file(tmp_path, pg_database.cluster.port, pg_database.name)
        path.write_text(path.read_text().replace('user = "postgres"', 'user = "reader"'))
        result = etl_check(path)
    finally:
        pg_database.execute("DROP ROLE reader")
    assert result.returncode == 1
    out = result.stdout
    assert "FAIL  replication privilege" in out and 'ALTER ROLE "reader" WITH REPLICATION' in out
    assert "FAIL  replica identity" in out and "public.keyless" in out and "REPLICA IDENTITY FULL" in out
    assert "FAIL  table privileges" in out
    assert "WARN  schema change trigger" in out


def test_check_reports_unreachable_source(tmp_path: Path) -> None:
    from etl.testing import free_port

    result = etl_check(pipeline_file(tmp_path, free_port(), "postgres"))
    assert result.returncode == 1
    assert result.stdout.startswith("FAIL  source reachable")


def test_check_says_when_an_earlier_trigger_is_installed_that_the_role_may_not_update(
    pg_database: TestDatabase,
) -> None:
    db = pg_database
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t; CREATE ROLE reader LOGIN")
    with db.connect() as conn:
        install_ddl_trigger(conn)
        # An earlier release's function: another body (and the trigger on ALTER TABLE alone, as it was).
        body = conn.execute("SELECT prosrc FROM pg_proc WHERE oid = 'etl.emit_schema_change'::regproc").fetchone()
        assert body is not None
        conn.execute(
            "CREATE OR REPLACE FUNCTION etl.emit_schema_change() RETURNS event_trigger LANGUAGE plpgsql"
            f" AS {quote_literal(body[0] + '-- an earlier version')}"
        )
    try:
        config = pipeline_config(db, source={"user": "reader"})
        check = next(c for c in run_checks(config) if c.name == "schema change trigger")
    finally:
        db.execute("DROP ROLE reader")
    assert not check.ok and check.advisory
    assert "an earlier version is installed" in check.detail
    assert "etl ddl-trigger --print-sql" in (check.fix or "")


def test_check_names_the_tables_an_incremental_copy_copies_by_snapshot(pg_database: TestDatabase) -> None:
    db = pg_database
    db.execute(
        "CREATE TABLE keyed (tenant text, id uuid, PRIMARY KEY (tenant, id)); CREATE TABLE keyless (a int);"
        " CREATE TABLE patterned (k text NOT NULL); CREATE UNIQUE INDEX patterned_k ON patterned (k text_pattern_ops);"
        " ALTER TABLE patterned REPLICA IDENTITY USING INDEX patterned_k;"
        " CREATE PUBLICATION pub FOR TABLE keyed, keyless, patterned"
    )

    def check(method: str) -> list[Check]:
        return [c for c in run_checks(pipeline_config(db, copy={"method": method})) if c.name == "incremental copy"]

    assert check("snapshot") == []  # nothing to say
    (found,) = check("incremental")
    assert not found.ok and found.advisory and not found.failed
    assert found.detail == (
        "copied by snapshot instead: public.keyless (it has no primary key or replica identity index);"
        " public.patterned (its key's index orders by an operator class or a collation of its own)"
    )
    db.execute("DROP TABLE keyless, patterned")
    assert check("incremental")[0].ok


def test_status_says_which_tables_still_to_copy_an_incremental_copy_copies_by_snapshot(
    pg_database: TestDatabase,
) -> None:
    db = pg_database
    db.execute(
        "CREATE TABLE keyed (tenant text PRIMARY KEY); CREATE TABLE keyless (a int); CREATE TABLE done (a int);"
        " CREATE PUBLICATION pub FOR TABLE keyed, keyless, done"
    )
    ids = {
        name: int(db.execute(f"SELECT 'public.{name}'::regclass::oid")[0][0]) for name in ("keyed", "keyless", "done")
    }
    store = MemoryStore(pipeline_id=1)
    store.update_table_states(
        {
            ids["keyed"]: TableState.init(),
            ids["keyless"]: TableState.init(),
            ids["done"]: TableState(TableStateKind.READY),
        }
    )
    incremental = status_report(pipeline_config(db, copy={"method": "incremental"}), store)
    assert incremental.notes == (
        "public.keyless is copied by snapshot, not in chunks: it has no primary key or replica identity index",
    )
    assert status_report(pipeline_config(db), store).notes == ()
