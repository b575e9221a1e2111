"""Matching a lake table's columns to a new source schema: by attribute number, else by name, else by position."""

from __future__ import annotations

from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.ducklake.catalog import LakeColumn
from etl_spark.ducklake.schema_diff import diff

LAKE = (
    LakeColumn(1, "id", "int32", False, attnum=1),
    LakeColumn(2, "active", "boolean", True, attnum=2),
    LakeColumn(3, "score", "float64", True, attnum=3),
    LakeColumn(4, "tier", "varchar", True, attnum=4),
)


def schema(*columns: tuple[str, int, int | None]) -> TableSchema:
    return TableSchema(
        7,
        TableName("public", "t"),
        tuple(ColumnSchema(n, oid, attnum=a, primary_key=n == "id") for n, oid, a in columns),
    )


def test_a_rename_and_a_drop_in_one_change_keep_the_renamed_column() -> None:
    change = diff(LAKE, schema(("id", 23, 1), ("rating", 701, 3), ("tier", 25, 4)))
    assert [(old.column_id, name) for old, name in change.renames] == [(3, "rating")]
    assert [c.column_id for c in change.drops] == [2]
    assert change.adds == [] and change.retypes == []


def test_a_column_dropped_and_added_again_under_its_name_is_a_new_column() -> None:
    change = diff(LAKE, schema(("id", 23, 1), ("active", 16, 2), ("score", 701, 3), ("tier", 25, 9)))
    assert [c.column_id for c in change.drops] == [4]
    assert [c.name for c in change.adds] == ["tier"]
    assert change.renames == []


def test_swapped_names_follow_the_attribute_numbers() -> None:
    lake = (
        LakeColumn(1, "id", "int32", False, 1),
        LakeColumn(2, "a", "varchar", True, 2),
        LakeColumn(3, "b", "varchar", True, 3),
    )
    change = diff(lake, schema(("id", 23, 1), ("b", 25, 2), ("a", 25, 3)))
    assert sorted((old.column_id, name) for old, name in change.renames) == [(2, "b"), (3, "a")]
    assert change.drops == [] and change.adds == []


def test_without_attribute_numbers_names_then_positions_decide() -> None:
    lake = tuple(LakeColumn(c.column_id, c.name, c.type, c.nullable) for c in LAKE)  # a lake from before attnums
    change = diff(lake, schema(("id", 23, None), ("active", 16, None), ("rating", 701, None), ("tier", 25, None)))
    assert [(old.column_id, name) for old, name in change.renames] == [(3, "rating")]
    assert change.drops == [] and change.adds == []
