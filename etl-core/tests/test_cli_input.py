"""The `etl` command line given bad input: each case ends in a message that says what is wrong, never a
traceback, a mangled message or `hint=None`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.schema import TableName
from etl.testing import free_port
from etl.testing.pipelines import all_ready, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import write_config

PIPELINE = """
[pipeline]
id = 1
publication = "pub"
[source]
host = "127.0.0.1"
port = {port}
user = "postgres"
password = "${{PGPASSWORD}}"
sslmode = "disable"
connect_timeout = 2
"""


def etl(
    *args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "PGPASSWORD"}
    return subprocess.run(
        [*prefix, sys.executable, "-m", "etl.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**environ, **(env or {})},
    )


def pipeline_file(tmp_path: Path, text: str | None = None, port: int | None = None) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(text if text is not None else PIPELINE.format(port=port or free_port()))
    return path


def assert_clean_failure(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Exit 1 with every ``expected`` text in the output, and no traceback nor ``hint=None``."""
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out, out
    assert "hint=None" not in out and '"hint": null' not in out, out
    for text in expected:
        assert text in out, out
    return out


# -- config files that cannot be read ------------------------------------------------------------------


def test_config_file_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_bytes(PIPELINE.format(port=5432).replace('"pub"', '"caf\xe9"').encode("latin-1"))
    assert_clean_failure(etl("check", "-c", str(path)), f"{path}: not UTF-8 text: byte 0xe9 on line 4")


def test_config_file_is_a_directory(tmp_path: Path) -> None:
    assert_clean_failure(etl("status", "-c", str(tmp_path)), f"{tmp_path}: is a directory, not a config file")


def test_config_file_unreadable(tmp_path: Path) -> None:
    path = pipeline_file(tmp_path)
    path.chmod(0)
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:  # root reads a file of any mode: run etl without the capabilities that allow it
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv, so a file root cannot read cannot be made")
        prefix = ("setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", "--")
    result = etl("run", "-c", str(path), prefix=prefix)
    assert_clean_failure(result, f"{path}: permission denied reading the config file", "make the file readable")


def test_etl_config_names_the_file_when_c_is_not_given(tmp_path: Path) -> None:
    path = pipeline_file(tmp_path)
    assert_clean_failure(etl("check", env={"ETL_CONFIG": str(path)}), f"{path}: environment variable PGPASSWORD")
    other = tmp_path / "missing.toml"
    given = etl("check", "-c", str(other), env={"ETL_CONFIG": str(path)})  # -c wins
    assert_clean_failure(given, f"{other}: no such config file", "ETL_CONFIG")
    neither = etl("check", env={"ETL_CONFIG": ""})
    assert neither.returncode == 2 and "-c/--config" in neither.stderr, neither.stderr


# -- values ---------------------------------------------------------------------------------------------


def test_boolean_pipeline_id_is_refused_without_a_hint_none(tmp_path: Path) -> None:
    path = pipeline_file(tmp_path, PIPELINE.format(port=5432).replace("id = 1", "id = true"))
    for log_format in ("console", "json"):
        assert_clean_failure(
            etl("--log-format", log_format, "check", "-c", str(path), env={"PGPASSWORD": "x"}),
            "pipeline.id: expected an integer, got the boolean true",
        )


def test_unset_variable_for_a_password_reads_correctly(tmp_path: Path) -> None:
    path = pipeline_file(tmp_path)
    out = assert_clean_failure(etl("status", "-c", str(path)))
    assert "environment variable PGPASSWORD, used by source.password, is not set" in out
    assert "export PGPASSWORD in the environment of etl" in out
    assert "**********" not in out
    line = json.loads(etl("--log-format", "json", "status", "-c", str(path)).stderr.splitlines()[-1])
    assert line["event"].endswith("environment variable PGPASSWORD, used by source.password, is not set")


def test_an_invalid_password_value_reads_correctly(tmp_path: Path) -> None:
    path = pipeline_file(tmp_path, PIPELINE.format(port=5432).replace('"${PGPASSWORD}"', "5"))
    out = assert_clean_failure(etl("check", "-c", str(path)), "source.password (secret): Input should be")
    assert "**********" not in out


# -- names of tables ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ("public.", "a name is missing at its end"),
        ("..", "a name is missing at its start"),
        ('public."items', "a double quote is not closed"),
        ("a.b.c", "has 3 dot-separated parts"),
    ],
)
def test_resync_of_a_malformed_table_name(tmp_path: Path, table: str, problem: str) -> None:
    text = PIPELINE.format(port=free_port()).replace("${PGPASSWORD}", "x")
    path = pipeline_file(tmp_path, text + f'[store]\ntype = "sqlite"\npath = "{tmp_path / "state.sqlite"}"\n')
    assert_clean_failure(etl("resync", "-c", str(path), "--table", table), f"not a table name: {table!r}: ", problem)


def test_names_with_dots_are_different_tables_everywhere(pg_database: TestDatabase, tmp_path: Path) -> None:
    db = pg_database
    db.execute('CREATE SCHEMA "public.a"; CREATE TABLE "public.a".b (id int PRIMARY KEY, v text)')
    db.execute('CREATE TABLE public."a.b" (id int PRIMARY KEY, v text)')
    db.execute("INSERT INTO \"public.a\".b VALUES (1, 'schema with a dot')")
    db.execute("INSERT INTO public.\"a.b\" VALUES (2, 'table with a dot'), (3, 'x')")
    db.execute('CREATE PUBLICATION pub FOR TABLE "public.a".b, public."a.b"')
    config = pipeline_config(db, store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")})
    path = write_config(tmp_path / "pipeline.toml", config)

    store = build_store(config, str(path))
    pipeline = Pipeline(config, store, build_destination(config, store, str(path)))
    with capture_logs() as logs:
        pipeline.start()
        try:
            wait_until(lambda: all_ready(pipeline, 2), "both tables ready", pipeline)
        finally:
            pipeline.shutdown()
    copied = {(e["table"], e["rows"]) for e in logs if e["event"] == "table copied"}
    assert copied == {('"public.a".b', 1), ('public."a.b"', 2)}

    status = etl("status", "-c", str(path))
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()]
    assert ['"public.a".b', "ready"] in [r[:2] for r in rows] and ['public."a.b"', "ready"] in [r[:2] for r in rows]

    with db.connect() as conn:
        oids = dict(conn.execute("""SELECT '"public.a".b'::regclass::oid, 'public."a.b"'::regclass::oid""").fetchall())
    for table, other in (('public."a.b"', '"public.a".b'), ('"public.a".b', 'public."a.b"')):
        result = etl("resync", "-c", str(path), "--table", table)
        assert result.returncode == 0, result.stderr
        assert f"resync of {table} requested" in result.stdout
        store = build_store(config, str(path))
        try:
            requested = store.take_resync_requests()
        finally:
            store.close()
        wanted = TableName.parse(table)
        assert requested == {oid: None for oid, name in _names(db).items() if name == wanted}, (table, other, oids)


def _names(db: TestDatabase) -> dict[int, TableName]:
    rows = db.execute(
        "SELECT c.oid, n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind = 'r' AND n.nspname IN ('public', 'public.a')"
    )
    return {oid: TableName(schema, name) for oid, schema, name in rows}


# -- etl check and etl status ---------------------------------------------------------------------------


def test_check_validates_the_store_and_destination_sections(pg_database: TestDatabase, tmp_path: Path) -> None:
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    config = pipeline_config(pg_database)
    good = write_config(tmp_path / "good.toml", config)
    result = etl("check", "-c", str(good))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS  store: store 'memory': the options are valid" in result.stdout
    assert "PASS  destination: destination 'memory': the options are valid" in result.stdout

    bad = write_config(
        tmp_path / "bad.toml",
        pipeline_config(
            pg_database,
            store={"type": "nosuchstore"},
            destination={"type": "ducklake", "data_path": str(tmp_path / "lake"), "colour": 1},
        ),
    )
    out = assert_clean_failure(etl("check", "-c", str(bad)))
    lines = out.splitlines()
    store = next(line for line in lines if line.startswith("FAIL  store:"))
    assert f"{bad}: store.type" in store and "nosuchstore" in store
    destination = next(line for line in lines if line.startswith("FAIL  destination:"))
    assert f"{bad}: invalid configuration" in destination
    assert "  destination.catalog: required key is missing" in out
    assert "  destination.colour: unknown key" in out
    assert "PASS  wal_level" in out  # the source checks still ran


def test_status_against_an_unreachable_source_does_not_promise_a_retry(tmp_path: Path) -> None:
    path = pipeline_file(tmp_path, PIPELINE.format(port=free_port()).replace("${PGPASSWORD}", "x"))
    out = assert_clean_failure(etl("status", "-c", str(path)), "cannot connect to Postgres at postgres@127.0.0.1:")
    assert "retried" not in out
    assert "check that the server is running and reachable from here" in out
