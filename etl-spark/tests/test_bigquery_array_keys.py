"""Keys with an array column: the SQL that matches rows by key, and the target table's key clauses, without a server.

BigQuery has no ``=`` for ARRAY, and refuses ARRAY columns in a primary key and in ``CLUSTER BY``; the
emulator accepts the last two, so these are checked on the SQL text. The end-to-end case is
``tests/test_bigquery_pipeline.py::test_copy_and_mixed_workload_equal_source`` (table ``tagged``).
"""

from __future__ import annotations

import re

import pyarrow as pa

from etl.api import OLD_COLUMN, OP_COLUMN
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.bigquery.history import with_key_change_deletes
from etl_spark.bigquery.statements import upsert
from etl_spark.bigquery.types import table_ddl, table_options

TAGGED = TableSchema(
    16900,
    TableName("public", "tagged"),
    (
        ColumnSchema("k", 1007, type_name="integer[]", nullable=False, primary_key=True),
        ColumnSchema("s", 25, nullable=False, primary_key=True),
        ColumnSchema("v", 25),
    ),
)
PLAIN = TableSchema(
    16901,
    TableName("public", "plain"),
    (ColumnSchema("id", 23, nullable=False, primary_key=True), ColumnSchema("s", 25, primary_key=True)),
)


def test_array_key_columns_are_matched_as_json_text() -> None:
    sql = "\n".join(upsert(TAGGED, "`p.d.t`", "`p.d.staged`", ["v"], None))
    assert not re.search(r"\.`k` = ", sql), sql  # BigQuery: "Equality is not defined for arguments of type ARRAY"
    assert "TO_JSON_STRING(U.`k`) = TO_JSON_STRING(T.`k`) AND U.`s` = T.`s`" in sql
    assert "ON TO_JSON_STRING(P.`k`) = TO_JSON_STRING(S.`_etl_prior_k`) AND P.`s` = S.`_etl_prior_s`" in sql
    # Scalar keys keep plain equality, as before.
    sql = "\n".join(upsert(PLAIN, "`p.d.t`", "`p.d.staged`", ["s"], (1, 9)))
    assert "TO_JSON_STRING" not in sql
    assert "WHERE T.`id` BETWEEN 1 AND 9 AND EXISTS (SELECT 1 FROM _etl_changes AS U WHERE U.`id` = T.`id`" in sql
    assert "ON P.`id` = S.`_etl_prior_id` AND P.`s` = S.`_etl_prior_s`" in sql


def test_a_key_with_an_array_is_not_declared_and_clusters_by_its_other_columns() -> None:
    assert table_ddl(TAGGED) == "`k` ARRAY<INT64>, `s` STRING, `v` STRING"
    assert table_options(TAGGED, None) == "CLUSTER BY `s`"
    assert table_ddl(PLAIN).endswith("PRIMARY KEY (`id`, `s`) NOT ENFORCED")
    assert table_options(PLAIN, None) == "CLUSTER BY `id`, `s`"


def test_history_tells_a_changed_array_key_from_an_unchanged_one() -> None:
    keys = pa.list_(pa.int32())
    old = pa.StructArray.from_arrays(
        [pa.array([[1, None], [1, None], []], keys), pa.array(["a", "a", "b"]), pa.nulls(3, pa.string())],
        names=["k", "s", "v"],  # the old key only (REPLICA IDENTITY DEFAULT)
        mask=pa.array([False, False, False]),
    )
    changes = pa.table(
        {
            "k": pa.array([[1, None], [None, 1], [1]], keys),  # same key, reordered elements, [] -> [1]
            "s": pa.array(["a", "a", "b"]),
            "v": pa.array(["x", "y", "z"]),
            OP_COLUMN: pa.array(["U", "U", "U"]),
            OLD_COLUMN: old,
        }
    )
    result = with_key_change_deletes(changes, TAGGED)
    deletes = result.filter(pa.compute.equal(result[OP_COLUMN], "D"))
    assert deletes.select(["k", "s"]).to_pylist() == [{"k": [1, None], "s": "a"}, {"k": [], "s": "b"}]
