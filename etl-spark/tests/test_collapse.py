"""The per-key collapse shared by the Spark destinations."""

from __future__ import annotations

from typing import Any

from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.collapse import ACTION, after, after_last_truncate, last_change_per_key, missing_columns

ITEMS = TableSchema(
    1, TableName("public", "items"), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("label", 25))
)


def test_watermark_and_truncate_cuts(kit: Any) -> None:
    b = kit.BatchBuilder()
    b.commit().insert(ITEMS, {"id": 1, "label": "a"}).insert(ITEMS, {"id": 2, "label": "b"})
    b.commit().truncate(ITEMS).insert(ITEMS, {"id": 3, "label": "c"})
    table = b.build().changes[ITEMS.id][0].table
    first_lsn = table["_etl_commit_lsn"][0].as_py()
    assert after(table, (first_lsn, 1))["id"].to_pylist() == [2, None, 3]
    truncated, rest = after_last_truncate(table)
    assert truncated
    assert rest["id"].to_pylist() == [3]
    assert missing_columns(table) == []


def test_last_change_per_key_with_key_change(kit: Any, spark: Any) -> None:
    from etl_spark.ducklake.destination import DuckLakeDestination

    b = kit.BatchBuilder()
    b.commit().insert(ITEMS, {"id": 1, "label": "a"}).update(ITEMS, {"id": 1, "label": "a2"})
    b.commit().update(ITEMS, {"id": 10, "label": "moved"}, old={"id": 2}).delete(ITEMS, {"id": 3})
    b.commit().insert(ITEMS, {"id": 3, "label": "again"}).update(ITEMS, {"id": 4, "label": "t"}, missing=("label",))
    segment = b.build().changes[ITEMS.id][0]
    frame = DuckLakeDestination.to_spark(_With(spark), segment.schema, segment.table)  # type: ignore[arg-type]
    result = last_change_per_key(frame, ["id", "label"], ["id"], ["label"]).toArrow()
    rows = sorted(zip(result["id"].to_pylist(), result[ACTION].to_pylist(), result["label"].to_pylist(), strict=True))
    assert rows == [
        (1, "upsert", "a2"),
        (2, "delete", None),
        (3, "upsert", "again"),
        (4, "upsert", None),
        (10, "upsert", "moved"),
    ]
    missing = dict(zip(result["id"].to_pylist(), result["_etl_missing"].to_pylist(), strict=True))
    assert missing[4] == ["label"]  # still missing: the destination takes it from its stored row
    assert missing[1] == []


class _With:
    def __init__(self, spark: Any) -> None:
        self.spark = spark
