"""Matching a lake table's columns to a new source schema by the engine's rules (etl.schema.match_columns)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from etl.errors import TableError
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.ducklake.catalog import LakeColumn
from etl_spark.ducklake.schema_diff import diff

LAKE = (
    LakeColumn(1, "id", "int32", False, 1, (23, -1)),
    LakeColumn(2, "active", "boolean", True, 2, (16, -1)),
    LakeColumn(3, "score", "float64", True, 3, (701, -1)),
    LakeColumn(4, "tier", "varchar", True, 4, (25, -1)),
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
        LakeColumn(1, "id", "int32", False, 1, (23, -1)),
        LakeColumn(2, "a", "varchar", True, 2, (25, -1)),
        LakeColumn(3, "b", "varchar", True, 3, (25, -1)),
    )
    change = diff(lake, schema(("id", 23, 1), ("b", 25, 2), ("a", 25, 3)))
    assert sorted((old.column_id, name) for old, name in change.renames) == [(2, "b"), (3, "a")]
    assert change.drops == [] and change.adds == []


def test_without_attribute_numbers_a_rename_in_place_is_followed() -> None:
    lake = tuple(replace(c, attnum=None) for c in LAKE)  # columns added while only RELATION messages came
    change = diff(lake, schema(("id", 23, None), ("active", 16, None), ("rating", 701, None), ("tier", 25, None)))
    assert [(old.column_id, name) for old, name in change.renames] == [(3, "rating")]
    assert change.drops == [] and change.adds == []


def test_a_drop_and_an_add_of_one_lake_type_are_not_taken_for_a_rename() -> None:
    # varchar(10) dropped, text added, score between them: the engine saw no rename in place (positions
    # moved), so the new column must not take the dropped one's values although both are varchar in the lake.
    lake = (
        LakeColumn(1, "id", "int32", False, 1, (23, -1)),
        LakeColumn(2, "code", "varchar", True, 2, (1043, 14)),
        LakeColumn(3, "score", "float64", True, 3, (701, -1)),
    )
    change = diff(lake, schema(("id", 23, 1), ("score", 701, 3), ("note", 25, None)))
    assert [c.column_id for c in change.drops] == [2]
    assert [c.name for c in change.adds] == ["note"]
    assert change.renames == []


def test_columns_of_unknown_source_match_by_name_only() -> None:
    lake = tuple(replace(c, attnum=None, source_type=None) for c in LAKE)  # DuckDB added them, say
    change = diff(lake, schema(("id", 23, None), ("active", 16, None), ("rating", 701, None), ("tier", 25, None)))
    assert [c.column_id for c in change.drops] == [3]
    assert [c.name for c in change.adds] == ["rating"]
    assert change.renames == []


def test_a_type_the_files_cannot_be_read_as_errors_the_table_with_the_resync_command() -> None:
    """``ALTER COLUMN ... TYPE ... USING`` to a type the existing files cannot be read as (text to integer)."""
    with pytest.raises(TableError, match="column tier changed type from varchar to int32") as error:
        diff(LAKE, schema(("id", 23, 1), ("active", 16, 2), ("score", 701, 3), ("tier", 23, 4)))
    assert "etl resync -c <pipeline file> --table public.t" in (error.value.hint or "")
