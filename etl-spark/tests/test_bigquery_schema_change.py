"""``ALTER TABLE`` actions from a recorded source schema and a new one (no server: tables built locally)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from google.cloud import bigquery

from etl.errors import TableError
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.bigquery.schema_change import alter_statements, unrecorded
from etl_spark.bigquery.types import bq_type

APPLIED = TableSchema(
    16800,
    TableName("public", "t"),
    (ColumnSchema("id", 23, attnum=1), ColumnSchema("a", 25, attnum=2), ColumnSchema("b", 25, attnum=3)),
)


def table_of(schema: TableSchema) -> bigquery.Table:
    return bigquery.Table("p.d.t", schema=[bigquery.SchemaField(c.name, bq_type(c).ddl) for c in schema.columns])


def test_swapped_names_pass_through_free_names() -> None:
    id_, a, b = APPLIED.columns
    swapped = replace(APPLIED, columns=(id_, replace(a, name="b"), replace(b, name="a")))
    assert alter_statements(table_of(APPLIED), APPLIED, swapped).actions == [
        "RENAME COLUMN `a` TO `_etl_rename_0`",
        "RENAME COLUMN `b` TO `_etl_rename_1`",
        "RENAME COLUMN `_etl_rename_0` TO `b`",
        "RENAME COLUMN `_etl_rename_1` TO `a`",
    ]


def test_a_name_dropped_and_added_again_is_a_new_column() -> None:
    id_, _a, b = APPLIED.columns
    again = replace(APPLIED, columns=(id_, b, ColumnSchema("a", 25, attnum=4)))
    assert alter_statements(table_of(APPLIED), APPLIED, again).actions == ["DROP COLUMN `a`", "ADD COLUMN `a` STRING"]


def test_without_a_record_columns_match_by_name_only() -> None:
    id_, a, b = APPLIED.columns
    table = table_of(APPLIED)
    renamed = replace(APPLIED, columns=(id_, replace(a, name="c"), b))
    assert alter_statements(table, unrecorded(table, APPLIED), renamed).actions == [
        "DROP COLUMN `a`",
        "ADD COLUMN `c` STRING",
    ]


def test_a_changed_type_errors_the_table() -> None:
    id_, a, b = APPLIED.columns
    retyped = replace(APPLIED, columns=(id_, replace(a, type_oid=23), b))
    with pytest.raises(TableError, match="column a changed type from STRING to INT64") as error:
        alter_statements(table_of(APPLIED), APPLIED, retyped)
    assert error.value.table_id == APPLIED.id
    assert f"etl resync -c <pipeline file> --table {APPLIED.name}" in (error.value.hint or "")


def test_a_history_table_keeps_dropped_columns_under_free_names() -> None:
    id_ = APPLIED.columns[0]
    # ``a`` was dropped before (attnum 2); another ``a`` of unknown attnum went the same way since.
    table = bigquery.Table(
        "p.d.t",
        schema=[
            *table_of(APPLIED).schema,
            bigquery.SchemaField("_etl_dropped_2_a", "STRING"),
            bigquery.SchemaField("_etl_op", "STRING"),
        ],
    )
    own = frozenset({"_etl_dropped_2_a", "_etl_op"})
    fewer = replace(APPLIED, columns=(id_,))
    assert alter_statements(table, APPLIED, fewer, own, keep_dropped=True).actions == [
        "RENAME COLUMN `a` TO `_etl_dropped_2_a_2`",
        "RENAME COLUMN `b` TO `_etl_dropped_3_b`",
    ]
    assert alter_statements(table, APPLIED, fewer, own).actions == ["DROP COLUMN `a`", "DROP COLUMN `b`"]


def test_added_columns_with_a_constant_default_fill_the_older_rows() -> None:
    added = replace(
        APPLIED,
        columns=(
            *APPLIED.columns,
            ColumnSchema("n", 23, attnum=4, missing_value="0"),
            ColumnSchema("s", 25, attnum=5, missing_value="it's \\ é"),
            ColumnSchema("v", 25, attnum=6),
            ColumnSchema("t", 1114, attnum=7, missing_value="2020-01-01 10:00:00.5"),
            ColumnSchema("a", 1007, attnum=8, missing_value="{1}"),
        ),
    )
    alteration = alter_statements(table_of(APPLIED), APPLIED, added)
    assert [c.name for c in alteration.added] == ["n", "s", "v", "t", "a"]
    assert alteration.fill(added, "`d.t`") == [
        "UPDATE `d.t` SET `n` = 0, `s` = 'it\\'s \\\\ \\U000000e9',"
        " `t` = DATETIME(TIMESTAMP '2020-01-01T10:00:00.500000+00:00', 'UTC'), `a` = ARRAY<INT64>[1] WHERE TRUE"
    ]
    assert alter_statements(table_of(APPLIED), APPLIED, APPLIED).fill(APPLIED, "`d.t`") == []
