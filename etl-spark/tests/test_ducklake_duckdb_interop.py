"""DuckDB and the pipeline share a lake: DuckDB creates it, writes to it and compacts it between runs."""

from __future__ import annotations

import uuid
from datetime import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.destination.memory import MemoryDestination, sort_rows
from etl.errors import DestinationError
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl_spark.ducklake import batch_commits

ITEMS = TableSchema(
    16600,
    TableName("main", "items"),
    (ColumnSchema("id", 23, nullable=False, primary_key=True), ColumnSchema("label", 25)),
)


def contents(lake: Any) -> list[dict[str, Any]]:
    rows = lake.query("SELECT id, label FROM lake.main.items")
    return sort_rows(({"id": i, "label": label} for i, label in rows))


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
    con.execute("CALL ducklake_flush_inlined_data('lake')")  # the row the batch inlined
    con.execute("CALL ducklake_merge_adjacent_files('lake')")
    con.execute("CALL ducklake_rewrite_data_files('lake', delete_threshold => 0.0)")
    con.close()
    changes = lake.query("SELECT string_agg(changes_made, ',') FROM __ducklake_metadata_lake.ducklake_snapshot_changes")
    assert "inline_flush" in changes[0][0]
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

    real_plan = batch_commits.plan_changes
    plans = []

    def plan_then_compact(dest: Any, segment: Any, inline_limit: int, state: Any) -> Any:
        plan = real_plan(dest, segment, inline_limit, state)
        plans.append(plan)
        if len(plans) == 1:  # DuckDB compacts after the positions were found, before the commit
            con = lake.duckdb()
            con.execute("CALL ducklake_merge_adjacent_files('lake')")
            con.close()
        return plan

    monkeypatch.setattr(batch_commits, "plan_changes", plan_then_compact)
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


TOKENS = TableSchema(
    16602,
    TableName("main", "tokens"),
    (ColumnSchema("id", 2950, nullable=False, primary_key=True), ColumnSchema("seen", 1083), ColumnSchema("n", 23)),
)
SLOTS = TableSchema(
    16603, TableName("main", "slots"), (ColumnSchema("seen", 1083), ColumnSchema("owner", 2950)), ReplicaIdentity.FULL
)


def as_text(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted((tuple(None if v is None else str(v) for v in row) for row in rows), key=str)


def test_uuid_and_time_values_in_files_duckdb_rewrote_are_still_matched(lake: Any, kit: Any) -> None:
    # DuckDB rewrites these text-held columns in Parquet's own UUID and TIME types, which Spark reads apart.
    tokens = [{"id": str(uuid.UUID(int=i)), "seen": time(i, 30, 0, i), "n": i} for i in range(1, 7)]
    tokens.append({"id": str(uuid.UUID(int=99)), "seen": None, "n": 99})
    slots = [{"seen": time(9), "owner": str(uuid.UUID(int=1))}] * 2 + [{"seen": None, "owner": None}]
    destination = kit.make_destination(lake)
    reference = MemoryDestination()
    for target in (destination, reference):
        for part in (tokens[:3], tokens[3:]):  # two files each, for DuckDB to merge
            target.write_table_rows(TOKENS, kit.rows_table(TOKENS, part))
        for part in (slots[:1], slots[1:]):
            target.write_table_rows(SLOTS, kit.rows_table(SLOTS, part))
    destination.shutdown()
    con = lake.duckdb()
    con.execute("CALL ducklake_merge_adjacent_files('lake')")
    listed = con.execute("SELECT data_file FROM ducklake_list_files('lake', 'tokens', schema => 'main')").fetchall()
    files = [path for (path,) in listed]
    con.close()
    stored = pq.read_schema(files[0])
    assert len(files) == 1 and not pa.types.is_string(stored.field("id").type)  # DuckDB's own types now

    destination = kit.make_destination(lake)
    b = kit.BatchBuilder()
    batch = (
        b.commit()
        .update(TOKENS, {**tokens[1], "seen": time(23, 59, 59, 999999), "n": 20})
        .delete(TOKENS, {"id": tokens[2]["id"]})
        .update(TOKENS, {**tokens[3], "id": str(uuid.UUID(int=400))}, old={"id": tokens[3]["id"]})
        .update(TOKENS, {**tokens[6], "n": 990})
        .delete(SLOTS, slots[0])
        .delete(SLOTS, slots[2])
        .build()
    )
    for target in (destination, reference):
        target.write_events(batch)
    # One scan over a file of each kind: the row updated above (now in this writer's file) and one DuckDB wrote.
    batch = b.commit().delete(TOKENS, {"id": tokens[1]["id"]}).delete(TOKENS, {"id": tokens[4]["id"]}).build()
    for target in (destination, reference):
        target.write_events(batch)
    for schema in (TOKENS, SLOTS):
        names = ", ".join(schema.column_names)
        expected = [tuple(r[n] for n in schema.column_names) for r in reference.rows(str(schema.name))]
        assert as_text(lake.query(f"SELECT {names} FROM lake.{schema.name}")) == as_text(expected), schema.name
