"""BigQuery type checks that need no server: JSON integers beyond 64 bits, arrays of arrays."""

from __future__ import annotations

import pyarrow as pa
import pytest

from etl.errors import TableError
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.bigquery.types import staged, table_ddl

DOCS = TableSchema(
    16700,
    TableName("public", "docs"),
    (ColumnSchema("id", 23, primary_key=True), ColumnSchema("doc", 3802), ColumnSchema("raw", 114)),
)


@pytest.mark.parametrize("column", DOCS.columns[1:], ids=["jsonb", "json"])
@pytest.mark.parametrize("number", ["18446744073709551616", "-9223372036854775809", "1" + "0" * 30])
def test_json_integers_beyond_64_bits_error_the_table(column: ColumnSchema, number: str) -> None:
    values = pa.array(['{"a": 1}', None, f'{{"n": [{number}]}}'], pa.string())
    with pytest.raises(TableError, match=f"column {column.name} holds the JSON integer {number[:12]}") as error:
        staged(DOCS, column, values)
    assert error.value.table_id == DOCS.id
    assert "JSON strings" in (error.value.hint or "")


def test_json_within_64_bits_and_long_digit_strings_pass_unchanged() -> None:
    values = pa.array(
        [
            '{"max": 18446744073709551615, "min": -9223372036854775808}',
            '{"id": "123456789012345678901234567890"}',
            '{"x": 1.2345678901234567890123}',
            None,
        ],
        pa.string(),
    )
    assert staged(DOCS, DOCS.columns[1], values).to_pylist() == values.to_pylist()


def test_arrays_of_arrays_error_the_table_at_creation() -> None:
    grid = TableSchema(
        16701,
        TableName("public", "grid"),
        (ColumnSchema("id", 23, primary_key=True), ColumnSchema("cells", 1007, type_name="integer[][]")),
    )
    with pytest.raises(TableError, match="column cells is integer\\[\\]\\[\\], an array of 2 dimensions") as error:
        table_ddl(grid)
    assert error.value.table_id == grid.id
    flat = TableSchema(grid.id, grid.name, (grid.columns[0], ColumnSchema("cells", 1007, type_name="integer[]")))
    assert table_ddl(flat) == "`id` INT64, `cells` ARRAY<INT64>, PRIMARY KEY (`id`) NOT ENFORCED"


ARRAYS = TableSchema(
    16702,
    TableName("public", "arrays"),
    (
        ColumnSchema("id", 23, primary_key=True),
        ColumnSchema("days", 1182),  # date[], as a RELATION message describes it (no type name)
        ColumnSchema("ids", 2951, type_name="uuid[]"),
        ColumnSchema("moods", 16800, type_name="mood[]"),  # an array of a user-defined enum: text elements
        ColumnSchema("small", 1005, type_name="smallint[]"),
    ),
)


def test_one_dimensional_arrays_of_other_elements_are_bigquery_arrays() -> None:
    assert table_ddl(ARRAYS) == (
        "`id` INT64, `days` ARRAY<DATE>, `ids` ARRAY<STRING>, `moods` ARRAY<STRING>, `small` ARRAY<INT64>,"
        " PRIMARY KEY (`id`) NOT ENFORCED"
    )
    small = staged(ARRAYS, ARRAYS.columns[4], pa.array([[1, 2], None], pa.list_(pa.int16())))
    assert small.type == pa.list_(pa.int64()) and small.to_pylist() == [[1, 2], None]


def test_array_elements_are_checked_like_values() -> None:
    infinity = pa.array([2**31 - 1], pa.int32()).cast(pa.date32())
    days = pa.ListArray.from_arrays(pa.array([0, 1], pa.int32()), infinity)
    with pytest.raises(TableError, match="column days holds a value outside BigQuery's range"):
        staged(ARRAYS, ARRAYS.columns[1], days)
    with pytest.raises(TableError, match="column ids holds an array with a NULL element"):
        staged(ARRAYS, ARRAYS.columns[2], pa.array([["a", None]], pa.list_(pa.string())))


@pytest.mark.parametrize(("oid", "name"), [(1231, "numeric[]"), (1115, "timestamp without time zone[]"), (3807, "")])
def test_arrays_of_converted_elements_error_the_table_at_creation(oid: int, name: str) -> None:
    xs = ColumnSchema("xs", oid, type_name=name)
    schema = TableSchema(16703, TableName("public", "t"), (ColumnSchema("id", 23), xs))
    with pytest.raises(TableError, match=r"column xs is .*, an array whose elements this destination cannot convert"):
        table_ddl(schema)


def test_column_names_the_destination_reserves_error_the_table_at_creation() -> None:
    schema = TableSchema(
        16703,
        TableName("public", "clash"),
        (ColumnSchema("id", 23, primary_key=True), ColumnSchema("_etl_action", 25)),
    )
    with pytest.raises(
        TableError, match="column _etl_action starts with _etl_, which the bigquery destination"
    ) as error:
        table_ddl(schema)
    assert error.value.table_id == schema.id
