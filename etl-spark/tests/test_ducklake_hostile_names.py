"""Schema and table names from the source are hostile input: their files stay inside the lake's data path, and
maintenance deletes nothing that is not the lake's own.

Anyone who can create a table in a published schema chooses its name (``../../victim``, ``a/b``, control
characters), and the pipeline writes and deletes files as its own OS user.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from etl.errors import TableError
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.ducklake.catalog import inside
from etl_spark.ducklake.catalog.model import directory_name
from etl_spark.ducklake.maintenance import Maintenance, MaintenanceConfig

HOSTILE = [
    ("public", "../../victim"),
    ("public", ".."),
    ("public", "."),
    ("public", "a/b"),
    ("public", "/etc"),
    ("public", "tab\there\x01\x7f"),
    ("public", "é" * 31),  # 62 bytes, as long as a Postgres name gets
    ("../..", "t"),
    ("~2E~2E", "plain"),  # what ".." becomes: a name of its own, in its own directory
]


def schema_of(number: int, schema: str, name: str) -> TableSchema:
    return TableSchema(
        17500 + number, TableName(schema, name), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("v", 25))
    )


def test_directory_names_are_one_safe_segment_and_distinct() -> None:
    names = [name for pair in HOSTILE for name in pair] + ["plain_Name-1", "~2E~2E", "x" * 63]
    directories = {name: directory_name(name) for name in names}
    assert directories["plain_Name-1"] == "plain_Name-1/"  # as DuckDB names them
    assert directories[".."] == "~2E~2E/"
    for name, directory in directories.items():
        segment = directory.removesuffix("/")
        assert segment and "/" not in segment and segment not in (".", ".."), name
        assert segment.isascii() and segment.isprintable() and len(segment) <= 189, name
    assert len(set(directories.values())) == len(set(directories))
    for data_path in ("/var/lake/", "s3://bucket/lake/"):
        for schema, table in HOSTILE:
            assert inside(data_path, data_path + directory_name(schema) + directory_name(table) + "f.parquet")
        assert not inside(data_path, data_path + "public/../../victim/")
        assert not inside(data_path, data_path.rstrip("/") + "-other/t/")


def test_hostile_names_write_inside_the_data_path_and_read_back(lake: Any, kit: Any, tmp_path: Path) -> None:
    destination = kit.make_destination(lake)
    for number, (schema, name) in enumerate(HOSTILE):
        rows = pa.table({"id": pa.array([number], pa.int32()), "v": pa.array([name])})
        destination.write_table_rows(schema_of(number, schema, name), rows)
    data = Path(lake.data_path)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".parquet"]
    assert written and all(p.is_relative_to(data) for p in written), sorted(map(str, written))
    assert not (tmp_path / "victim").exists()
    for number, (schema, name) in enumerate(HOSTILE):
        quoted = '"' + schema.replace('"', '""') + '"."' + name.replace('"', '""') + '"'
        assert lake.query(f"SELECT id, v FROM lake.{quoted}") == [(number, name)]


@pytest.mark.parametrize("escape", ["../../victim/", "/absolute/victim/"])
def test_a_table_directory_outside_the_lake_is_neither_written_nor_swept(
    lake: Any, kit: Any, tmp_path: Path, escape: str
) -> None:
    """A lake table whose directory lies outside the data path (an older writer kept a hostile name as its
    directory): a write into it stops the table with a hint, and the orphan sweep leaves its files alone."""
    schema = schema_of(0, "public", "victim")
    destination = kit.make_destination(lake, inline_row_limit=0)
    destination.write_table_rows(schema, pa.table({"id": pa.array([1], pa.int32()), "v": pa.array(["a"])}))
    victim = tmp_path / "victim" if escape.startswith("..") else tmp_path / "absolute-victim"
    path = escape if escape.startswith("..") else f"{victim}/"
    with destination.catalog.engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE ducklake_table SET path = ?, path_is_relative = ? WHERE table_name = 'victim'"
            if lake.url.startswith("sqlite")
            else "UPDATE ducklake_table SET path = %s, path_is_relative = %s WHERE table_name = 'victim'",
            (path, escape.startswith("..")),
        )
    destination.shutdown()
    victim.mkdir()
    an_hour_ago = time.time() - 3600
    kept = [victim / "important.conf", victim / f"ducklake-{uuid.uuid4()}.parquet"]
    for file in kept:
        file.write_bytes(b"keep me")
        os.utime(file, (an_hour_ago, an_hour_ago))

    destination = kit.make_destination(lake, inline_row_limit=0)
    table = destination.catalog.handle(schema.id).table
    assert Path(table.directory).resolve() == victim.resolve()
    Maintenance(MaintenanceConfig(orphan_after_seconds=600), destination.metrics).orphans(
        destination.lake, copying=lambda: False
    )
    assert all(file.exists() for file in kept)
    destination.lake.storage.delete(str(file) for file in kept)  # a catalog that schedules them: still refused
    assert all(file.exists() for file in kept)
    with pytest.raises(TableError, match="outside the lake's data path") as error:
        destination.write_table_rows(schema, pa.table({"id": pa.array([2], pa.int32()), "v": pa.array(["b"])}))
    assert "etl resync" in (error.value.hint or "")
    assert sorted(victim.iterdir()) == sorted(kept)
