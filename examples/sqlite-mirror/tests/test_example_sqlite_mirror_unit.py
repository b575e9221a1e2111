"""The sqlite_mirror destination called directly: copies, table names, column changes and errors."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from etl.errors import DestinationError, TableError
from etl.lsn import Lsn
from etl.postgres.codecs import arrow_field
from etl.schema import ColumnSchema, TableName, TableSchema

from etl_plugin_example import MirrorReader, SqliteMirrorDestination
from etl_plugin_example.mirror_schema import column_changes

INT4, TEXT = 23, 25


def make_schema(
    table_id: int = 1, name: str = "public.t", lsn: int = 100, columns: tuple[ColumnSchema, ...] | None = None
) -> TableSchema:
    cols = columns or (ColumnSchema("id", INT4, primary_key=True, attnum=1), ColumnSchema("v", TEXT, attnum=2))
    return TableSchema(table_id, TableName.parse(name), cols, snapshot_lsn=Lsn(lsn))


def copied(schema: TableSchema, **values: list[Any]) -> pa.Table:
    fields = [arrow_field(c) for c in schema.columns]
    return pa.Table.from_arrays([pa.array(values[f.name], f.type) for f in fields], schema=pa.schema(fields))


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[SqliteMirrorDestination]:
    destination = SqliteMirrorDestination(tmp_path / "mirror.db")
    destination.startup()
    yield destination
    destination.shutdown()


def test_a_new_copy_replaces_what_the_mirror_held(mirror: SqliteMirrorDestination) -> None:
    first = make_schema(lsn=100)
    mirror.write_table_rows(first, copied(first, id=[1, 2], v=["a", "b"]))
    mirror.write_table_rows(first, copied(first, id=[3], v=["c"]))  # the same copy goes on
    assert [r["id"] for r in mirror.rows("public.t")] == [1, 2, 3]
    again = make_schema(lsn=200)  # a copy from a later snapshot, without drop_table_for_copy before it
    mirror.write_table_rows(again, copied(again, id=[9], v=["z"]))
    assert mirror.rows("public.t") == [{"id": 9, "v": "z"}]


def test_empty_copy_creates_the_table(mirror: SqliteMirrorDestination) -> None:
    schema = make_schema()
    mirror.write_table_rows(schema, copied(schema, id=[], v=[]))
    assert mirror.rows("t") == []
    with MirrorReader(mirror.path) as reader:
        assert reader.schema("t") == schema  # attribute numbers included: renames are found after a restart
        assert [c.attnum for c in reader.schema("t").columns] == [1, 2]
        assert reader.watermark("t") is None


def test_drop_table_for_copy_forgets_table_and_is_idempotent(mirror: SqliteMirrorDestination) -> None:
    schema = make_schema()
    mirror.write_table_rows(schema, copied(schema, id=[1], v=["a"]))
    mirror.drop_table_for_copy(schema)
    mirror.drop_table_for_copy(schema)
    with MirrorReader(mirror.path) as reader:
        assert reader.tables() == []
        with pytest.raises(KeyError, match=r"public\.t"):
            reader.rows("t")


def test_a_name_held_by_another_source_table_is_moved_aside(mirror: SqliteMirrorDestination) -> None:
    old = make_schema(table_id=1)
    mirror.write_table_rows(old, copied(old, id=[1], v=["old table"]))
    new = make_schema(table_id=2)  # the source table was dropped and created again: a new OID
    mirror.write_table_rows(new, copied(new, id=[2], v=["new table"]))
    assert mirror.rows("t") == [{"id": 2, "v": "new table"}]
    with sqlite3.connect(mirror.path) as conn:
        kept = conn.execute('SELECT id, v FROM "public.t#1"').fetchall()
    assert kept == [(1, "old table")]


def test_column_changes_by_attribute_number() -> None:
    old = make_schema(columns=(ColumnSchema("id", INT4, primary_key=True, attnum=1), ColumnSchema("a", TEXT, attnum=2)))
    renamed = make_schema(
        columns=(ColumnSchema("id", INT4, primary_key=True, attnum=1), ColumnSchema("b", TEXT, attnum=2))
    )
    changes = column_changes(old, renamed)
    assert (changes.renames, changes.drops, changes.adds) == ([("a", "b")], [], [])
    replaced = make_schema(  # drop a, add b: attribute numbers tell it from a rename
        columns=(ColumnSchema("id", INT4, primary_key=True, attnum=1), ColumnSchema("b", TEXT, attnum=3))
    )
    changes = column_changes(old, replaced)
    assert (changes.renames, changes.drops, [c.name for c in changes.adds]) == ([], ["a"], ["b"])


def test_column_changes_without_attribute_numbers() -> None:
    old = make_schema(columns=(ColumnSchema("id", INT4), ColumnSchema("a", TEXT), ColumnSchema("n", INT4)))
    in_place = make_schema(columns=(ColumnSchema("id", INT4), ColumnSchema("b", TEXT), ColumnSchema("n", INT4)))
    assert column_changes(old, in_place).renames == [("a", "b")]  # as the engine inferred from RELATION messages
    # a dropped and b added at the end: the positions moved, so no rename is inferred
    moved = make_schema(columns=(ColumnSchema("id", INT4), ColumnSchema("n", INT4), ColumnSchema("b", TEXT)))
    changes = column_changes(old, moved)
    assert (changes.renames, changes.drops, [c.name for c in changes.adds]) == ([], ["a"], ["b"])


# x was added while only RELATION messages described the table (no attribute number yet).
MIXED = make_schema(
    columns=(
        ColumnSchema("id", INT4, primary_key=True, attnum=1),
        ColumnSchema("a", TEXT, attnum=2),
        ColumnSchema("d", TEXT, attnum=3),
        ColumnSchema("x", INT4),
    )
)


def test_a_drop_and_add_of_a_same_typed_column_is_not_a_rename() -> None:
    # x dropped, y (same type, same place) added: y's new attribute number says it is another column.
    replaced = make_schema(columns=(*MIXED.columns[:3], ColumnSchema("y", INT4, attnum=5)))
    changes = column_changes(MIXED, replaced)
    assert (changes.renames, changes.drops, [c.name for c in changes.adds]) == ([], ["x"], ["y"])


def test_a_rename_is_found_by_attribute_number_beside_a_drop() -> None:
    # a renamed to b and d dropped in one version; x now known by its attribute number, matched by name.
    changed = make_schema(
        columns=(MIXED.columns[0], ColumnSchema("b", TEXT, attnum=2), ColumnSchema("x", INT4, attnum=4))
    )
    changes = column_changes(MIXED, changed)
    assert (changes.renames, changes.drops, changes.adds) == ([("a", "b")], ["d"], [])


def test_a_type_change_fails_the_table_with_a_hint() -> None:
    old = make_schema(table_id=7)
    retyped = make_schema(table_id=7, columns=(ColumnSchema("id", INT4, primary_key=True), ColumnSchema("v", INT4)))
    with pytest.raises(TableError, match="column v changed type") as caught:
        column_changes(old, retyped)
    assert caught.value.table_id == 7
    assert caught.value.hint and "etl resync" in caught.value.hint


def test_startup_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "mirror.db"
    path.write_text("not a database, just some text long enough to have a header" * 20)
    with pytest.raises(DestinationError, match="not a database") as caught:
        SqliteMirrorDestination(path).startup()
    assert caught.value.hint and "another path" in caught.value.hint


def test_startup_in_a_missing_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(DestinationError, match="cannot open the SQLite mirror") as caught:
        SqliteMirrorDestination(tmp_path / "absent" / "mirror.db").startup()
    assert caught.value.hint and "directory" in caught.value.hint


def test_writes_before_startup_fail_clearly(tmp_path: Path) -> None:
    schema = make_schema()
    with pytest.raises(DestinationError, match="not open"):
        SqliteMirrorDestination(tmp_path / "m.db").write_table_rows(schema, copied(schema, id=[], v=[]))
