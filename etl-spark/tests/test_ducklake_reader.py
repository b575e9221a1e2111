"""Reading a lake back with DuckDB: attach targets from catalog URLs, preview, errors without secrets."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import threading
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from etl.errors import DestinationError
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.ducklake.reader import duckdb_target, open_lake

ITEMS = TableSchema(
    16700,
    TableName("sales", "items"),
    (ColumnSchema("id", 23, nullable=False, primary_key=True), ColumnSchema("label", 25)),
)


def test_attach_targets_from_catalog_urls() -> None:
    assert duckdb_target("sqlite:////var/lake/catalog.sqlite") == ("ducklake:sqlite:/var/lake/catalog.sqlite", "sqlite")
    target, extension = duckdb_target("postgresql://etl:it's secret@db.internal:6543/lake?sslmode=require")
    assert extension == "postgres"
    assert target == (
        "ducklake:postgres:host=db.internal port=6543 dbname=lake user=etl password='it\\'s secret' sslmode=require"
    )


def test_attach_failure_names_the_problem_not_the_password() -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(DestinationError) as failure:
        open_lake(f"postgresql://etl:hunter2secret@127.0.0.1:{port}/lake")
    assert "could not attach" in failure.value.message
    assert "hunter2secret" not in failure.value.message + (failure.value.hint or "")


def test_preview_reads_the_table_with_duckdb(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    rows = [{"id": i, "label": f"label {i}"} for i in range(12, 0, -1)]
    destination.write_table_rows(ITEMS, kit.rows_table(ITEMS, rows))
    preview = destination.preview(ITEMS.name, 3)
    assert preview.total == 12
    assert preview.rows == [{"id": 1, "label": "label 1"}, {"id": 2, "label": "label 2"}, {"id": 3, "label": "label 3"}]
    assert preview.reader.startswith("DuckDB 1.5")
    with pytest.raises(KeyError):
        destination.preview(TableName("sales", "missing"), 3)


@pytest.mark.parametrize("lake", ["sqlite"], indirect=True)
def test_a_sqlite_catalog_is_read_while_this_process_writes_it(lake: Any, kit: Any) -> None:
    # DuckDB's copy of SQLite does not see this process's locks: reading the live file in the middle of a
    # commit took the writer's journal for a crashed one and failed ("attempt to write a readonly database").
    destination = kit.make_destination(lake)
    destination.write_table_rows(ITEMS, kit.rows_table(ITEMS, [{"id": 1, "label": "one"}]))
    writer = sqlite3.connect(make_url(lake.url).database, isolation_level=None, check_same_thread=False)
    writer.execute("PRAGMA cache_size = 1")  # changed pages spill: a synced journal is on disk, as in a commit
    writer.execute("BEGIN IMMEDIATE")
    writer.executemany("INSERT INTO ducklake_tag VALUES (?, 0, NULL, 'k', ?)", [(i, "v" * 200) for i in range(2000)])
    commit = threading.Timer(1.0, writer.execute, ["COMMIT"])
    commit.start()
    try:
        con = open_lake(lake.url)  # waits for the commit, then reads a snapshot
        try:
            assert con.execute("SELECT id, label FROM lake.sales.items").fetchall() == [(1, "one")]
            assert con.execute("SELECT count(*) FROM __ducklake_metadata_lake.ducklake_tag").fetchall() == [(2000,)]
        finally:
            con.close()
    finally:
        commit.join()
        writer.close()


def test_a_process_checks_the_extensions_signatures_on_their_first_load() -> None:
    """Later connections skip DuckDB's signature check (hashing 35 MB per extension and connection): the first
    load in a process must have made it."""
    script = (
        "from etl_spark.ducklake.reader import connect_duckdb\n"
        "for _ in range(2):\n"
        "    con = connect_duckdb('sqlite')\n"
        "    print(con.execute(\"SELECT current_setting('allow_unsigned_extensions')\").fetchone()[0])\n"
        "    con.close()\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
