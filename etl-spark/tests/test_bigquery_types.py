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
