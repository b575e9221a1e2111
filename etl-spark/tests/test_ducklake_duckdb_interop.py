"""DuckDB and the pipeline share a lake: DuckDB creates it, writes to it and compacts it between runs."""

from __future__ import annotations

from typing import Any

import pytest

from etl.destination.memory import MemoryDestination, row_sort_key
from etl.errors import DestinationError
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.ducklake import destination as destination_module

ITEMS = TableSchema(
    16600,
    TableName("main", "items"),
    (ColumnSchema("id", 23, nullable=False, primary_key=True), ColumnSchema("label", 25)),
)


def contents(lake: Any) -> list[dict[str, Any]]:
    rows = lake.query("SELECT id, label FROM lake.main.items")
    return sorted(({"id": i, "label": label} for i, label in rows), key=row_sort_key)


def duckdb_creates_lake(lake: Any) -> None:
    con = lake.duckdb_bare()
    con.execute(f"ATTACH 'ducklake:{lake.duckdb_target}' AS lake (DATA_PATH '{lake.data_path}')")
    con.close()


def test_duckdb_writes_and_compacts_between_runs(lake: Any, kit: Any) -> None:
    duckdb_creates_lake(lake)
    destination = kit.make_destination(lake)
    destination.write_table_rows(ITEMS, kit.rows_table(ITEMS, [{"id": i, "label": f"l{i}"} for i in range(10)]))
    b = kit.BatchBuilder()
    destination.write_events(b.commit().insert(ITEMS, {"id": 10, "label": "l10"}).build())
    destination.shutdown()

    con = lake.duckdb()
    con.execute("INSERT INTO lake.main.items VALUES (100, 'from duckdb'), (101, 'from duckdb')")
    con.execute("DELETE FROM lake.main.items WHERE id = 1")
    con.execute("CALL ducklake_merge_adjacent_files('lake')")
    con.execute("CALL ducklake_rewrite_data_files('lake', delete_threshold => 0.0)")
    con.close()
    changes = lake.query("SELECT string_agg(changes_made, ',') FROM __ducklake_metadata_lake.ducklake_snapshot_changes")
    assert "merge_adjacent" in changes[0][0]  # DuckDB really rewrote the files the pipeline wrote

    reference = MemoryDestination()
    reference.write_table_rows(ITEMS, kit.rows_table(ITEMS, contents(lake)))
    destination = kit.make_destination(lake)
    batch = (
        b.commit()
        .update(ITEMS, {"id": 2, "label": "changed"})
        .delete(ITEMS, {"id": 100})
        .update(ITEMS, {"id": 300, "label": "moved"}, old={"id": 3})
        .insert(ITEMS, {"id": 11, "label": "l11"})
        .build()
    )
    for target in (destination, reference):
        target.write_events(batch)
    assert contents(lake) == reference.rows("main.items")


def test_conflicting_compaction_is_detected_and_the_batch_retried(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    destination = kit.make_destination(lake)
    destination.write_table_rows(ITEMS, kit.rows_table(ITEMS, [{"id": i, "label": f"l{i}"} for i in range(5)]))
    destination.write_table_rows(ITEMS, kit.rows_table(ITEMS, [{"id": i, "label": f"l{i}"} for i in range(5, 10)]))
    reference = MemoryDestination()
    reference.write_table_rows(ITEMS, kit.rows_table(ITEMS, contents(lake)))

    real_plan = destination_module.plan_changes
    plans = []

    def plan_then_compact(dest: Any, segment: Any) -> Any:
        plan = real_plan(dest, segment)
        plans.append(plan)
        if len(plans) == 1:  # DuckDB compacts after the positions were found, before the commit
            con = lake.duckdb()
            con.execute("CALL ducklake_merge_adjacent_files('lake')")
            con.close()
        return plan

    monkeypatch.setattr(destination_module, "plan_changes", plan_then_compact)
    batch = kit.BatchBuilder().commit().update(ITEMS, {"id": 7, "label": "x"}).delete(ITEMS, {"id": 1}).build()
    for target in (destination, reference):
        target.write_events(batch)
    assert len(plans) == 2
    assert contents(lake) == reference.rows("main.items")


def test_catalog_of_another_spec_version_is_refused(lake: Any, kit: Any) -> None:
    kit.make_destination(lake).shutdown()
    con = lake.duckdb_bare()
    con.execute(f"ATTACH '{lake.duckdb_target.split(':', 1)[1]}' AS cat (TYPE {lake.duckdb_target.split(':', 1)[0]})")
    con.execute("UPDATE cat.ducklake_metadata SET value = '0.3' WHERE key = 'version'")
    con.close()
    with pytest.raises(DestinationError, match=r"specification version '0\.3'"):
        kit.make_destination(lake)
