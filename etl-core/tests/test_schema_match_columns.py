"""match_columns: which column of an older schema version each column of a newer one is."""

from __future__ import annotations

from etl.schema import ColumnSchema, TableName, TableSchema, match_columns, renamed_in_place

INT4, TEXT = 23, 25


def schema(*columns: ColumnSchema) -> TableSchema:
    return TableSchema(1, TableName("public", "t"), columns)


def picks(old: TableSchema, new: TableSchema) -> list[int | None]:
    matched = match_columns(old, new)
    assert [column for _, column in matched] == list(new.columns)
    return [position for position, _ in matched]


KNOWN = schema(ColumnSchema("id", INT4, attnum=1), ColumnSchema("a", TEXT, attnum=2), ColumnSchema("n", INT4, attnum=3))


def test_a_rename_keeps_the_attribute_number() -> None:
    renamed = schema(ColumnSchema("id", INT4, attnum=1), ColumnSchema("b", TEXT, attnum=2), KNOWN.columns[2])
    assert picks(KNOWN, renamed) == [0, 1, 2]


def test_a_drop_and_add_in_place_is_a_new_column() -> None:
    replaced = schema(KNOWN.columns[0], ColumnSchema("b", TEXT, attnum=4), KNOWN.columns[2])
    assert picks(KNOWN, replaced) == [0, None, 2]


def test_a_column_added_again_under_its_old_name_is_a_new_column() -> None:
    again = schema(KNOWN.columns[0], KNOWN.columns[2], ColumnSchema("a", TEXT, attnum=4))
    assert picks(KNOWN, again) == [0, 2, None]


def test_a_column_without_attribute_number_matches_by_name() -> None:
    # x came from a RELATION message (no attribute number); the DDL trigger's next version knows it.
    old = schema(*KNOWN.columns, ColumnSchema("x", INT4))
    new = schema(
        ColumnSchema("id", INT4, attnum=1), ColumnSchema("b", TEXT, attnum=2), ColumnSchema("x", INT4, attnum=4)
    )
    assert picks(old, new) == [0, 1, 3]


def test_known_attribute_numbers_win_over_the_in_place_rule() -> None:
    # x (no attribute number) dropped, y of the same type added where it was: y's attribute number is new.
    old = schema(*KNOWN.columns, ColumnSchema("x", INT4))
    new = schema(*KNOWN.columns, ColumnSchema("y", INT4, attnum=5))
    assert renamed_in_place(old.columns, new.columns)
    assert picks(old, new) == [0, 1, 2, None]


def test_columns_nobody_numbered_follow_the_engines_in_place_rule() -> None:
    # rating was added and then renamed while only RELATION messages described the table.
    old = schema(*KNOWN.columns, ColumnSchema("rating", INT4))
    renamed = schema(*KNOWN.columns, ColumnSchema("stars", INT4))
    assert picks(old, renamed) == [0, 1, 2, 3]
    retyped = schema(*KNOWN.columns, ColumnSchema("stars", TEXT))  # not a rename: the type changed
    assert picks(old, retyped) == [0, 1, 2, None]


def test_without_any_attribute_numbers() -> None:
    old = schema(ColumnSchema("id", INT4), ColumnSchema("a", TEXT), ColumnSchema("n", INT4))
    assert picks(old, schema(ColumnSchema("id", INT4), ColumnSchema("b", TEXT), ColumnSchema("n", INT4))) == [0, 1, 2]
    moved = schema(ColumnSchema("id", INT4), ColumnSchema("n", INT4), ColumnSchema("b", TEXT))  # a dropped, b added
    assert picks(old, moved) == [0, 2, None]
    swapped_types = schema(ColumnSchema("c", INT4), ColumnSchema("d", INT4), ColumnSchema("n", INT4))
    assert picks(old, swapped_types) == [None, None, 2]


def test_renamed_in_place_needs_new_names_for_old_ones() -> None:
    a, b = ColumnSchema("a", INT4), ColumnSchema("b", INT4)
    assert renamed_in_place((a, b), (ColumnSchema("c", INT4), b))
    assert not renamed_in_place((a, b), (b, a))  # a swap reuses names: not an in-place rename
    assert not renamed_in_place((a, b), (a, b))  # nothing renamed
    assert not renamed_in_place((a,), (a, b))
