"""The bigquery destination against a local BigQuery server (local-bigquery 0.4.0): real Arrow batches in, rows read
back with google-cloud-bigquery, compared with the memory destination fed the same batches."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from etl.destination.base import DestinationContext
from etl.destination.memory import MemoryDestination, sort_rows
from etl.errors import TableError
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl.store.memory import MemoryStore
from etl_spark.bigquery.destination import BigQueryDestination
from etl_spark.bigquery.names import table_id
from etl_spark.testing.bigquery_emulator import PROJECT, BigQueryEmulator

NUMERIC_10_2 = ((10 << 16) | 2) + 4
NUMERIC_60_30 = ((60 << 16) | 30) + 4
ORDERS = TableSchema(
    16600,
    TableName("public", "order_items"),
    (
        ColumnSchema("id", 23, nullable=False, primary_key=True, attnum=1),
        ColumnSchema("note", 25, attnum=2),
        ColumnSchema("qty", 23, attnum=3),
        ColumnSchema("amount", 1700, NUMERIC_10_2, attnum=4),
        ColumnSchema("at", 1184, attnum=5),
        ColumnSchema("doc", 3802, attnum=6),
        ColumnSchema("tags", 1007, type_name="integer[]", attnum=7),
    ),
)
WIDE = TableSchema(
    16601,
    TableName("public", "wide"),
    (
        ColumnSchema("id", 23, nullable=False, primary_key=True),
        ColumnSchema("big", 1700, NUMERIC_60_30),
        ColumnSchema("day", 1082),
        ColumnSchema("blob", 17),
    ),
)


@pytest.fixture
def destination(
    bigquery_emulator: BigQueryEmulator, spark: Any, kit: Any, request: pytest.FixtureRequest
) -> BigQueryDestination:
    return kit.make_bigquery(bigquery_emulator, f"d_{request.node.name}")


def bq_rows(destination: BigQueryDestination, schema: TableSchema) -> list[dict[str, Any]]:
    names = ", ".join(f"`{c}`" for c in schema.column_names)
    ref = f"`{destination.config.project}.{destination.config.dataset}.{table_id(schema.name)}`"
    rows = destination.client.query_and_wait(f"SELECT {names} FROM {ref}")
    return sort_rows(dict(r.items()) for r in rows)


def ref_rows(reference: MemoryDestination, schema: TableSchema) -> list[dict[str, Any]]:
    import json

    rows = []
    for row in reference.rows(str(schema.name)):
        fixed = dict(row)
        if "doc" in fixed and fixed["doc"] is not None:
            fixed["doc"] = json.loads(fixed["doc"])
        if "tags" in fixed and fixed["tags"] is None:
            fixed["tags"] = []  # BigQuery reads a NULL array as [] (documented)
        rows.append(fixed)
    return sort_rows(rows)


def order(i: int, **changes: Any) -> dict[str, Any]:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=i)
    base = {"id": i, "note": f"n{i}", "qty": i, "amount": Decimal(f"{i}.50"), "at": at, "doc": f'{{"n": {i}}}'}
    return base | {"tags": [i, i + 1]} | changes


def test_copy_and_mixed_workload_equal_memory_reference(destination: BigQueryDestination, kit: Any) -> None:
    reference = MemoryDestination()
    copied = [order(i) for i in range(1, 6)]
    for target in (destination, reference):
        target.write_table_rows(ORDERS, kit.rows_table(ORDERS, copied))
    assert bq_rows(destination, ORDERS) == ref_rows(reference, ORDERS)

    b = kit.BatchBuilder()
    b.commit().insert(ORDERS, order(6, tags=None))
    b.update(ORDERS, order(2, qty=20))
    b.commit().update(ORDERS, order(30, note="n3"), old={"id": 3})  # key change: 3 -> 30
    b.delete(ORDERS, {"id": 4})
    b.update(ORDERS, order(5, qty=50), missing=("note",))  # unchanged TOAST: kept from the stored row
    batch = b.build()
    for target in (destination, reference):
        target.write_events(batch)
    expected = ref_rows(reference, ORDERS)
    assert bq_rows(destination, ORDERS) == expected
    assert [r["note"] for r in expected if r["id"] == 5] == ["n5"]

    destination.write_events(batch)  # a replay after a crash changes nothing
    assert bq_rows(destination, ORDERS) == expected

    # Schema changes: rename note -> comment; then drop qty and add extra (text); then a truncate.
    renamed = TableSchema(
        ORDERS.id, ORDERS.name, (ORDERS.columns[0], replace(ORDERS.columns[1], name="comment"), *ORDERS.columns[2:])
    )
    b.commit().insert(renamed, {**order(7), "comment": "c7"})
    destination.write_events(b.build())
    comments = {r["id"]: r["comment"] for r in bq_rows(destination, renamed)}
    assert comments == {1: "n1", 2: "n2", 5: "n5", 6: "n6", 7: "c7", 30: "n3"}  # values kept by the rename

    reshaped = TableSchema(
        ORDERS.id,
        ORDERS.name,
        (renamed.columns[0], renamed.columns[1], *renamed.columns[3:], ColumnSchema("extra", 25, attnum=8)),
    )
    b.commit().update(reshaped, {**order(7), "comment": "c7", "extra": "e7"})
    destination.write_events(b.build())
    rows = bq_rows(destination, reshaped)
    assert "qty" not in rows[0]
    assert {r["id"]: r["extra"] for r in rows} == {1: None, 2: None, 5: None, 6: None, 7: "e7", 30: None}

    b.commit().truncate(reshaped).insert(reshaped, {**order(8), "comment": "c8", "extra": "e8"})
    destination.write_events(b.build())
    assert [(r["id"], r["extra"]) for r in bq_rows(destination, reshaped)] == [(8, "e8")]
    staged = [p for p in Path(str(destination.config.staging_local_dir)).rglob("*") if p.is_file()]
    assert staged == []  # every staged file was deleted once loaded


def test_the_delete_of_touched_keys_is_bounded_by_their_range(destination: BigQueryDestination, kit: Any) -> None:
    reference = MemoryDestination()
    b = kit.BatchBuilder()
    b.commit().update(ORDERS, order(5), old={"id": 50}).insert(ORDERS, order(3))  # 50 moves to 5
    batch = b.build()
    for target in (destination, reference):
        target.write_table_rows(ORDERS, kit.rows_table(ORDERS, [order(1), order(2), order(50)]))
        target.write_events(batch)
    assert [r["id"] for r in bq_rows(destination, ORDERS)] == [1, 2, 3, 5]
    assert bq_rows(destination, ORDERS) == ref_rows(reference, ORDERS)
    scripts = [j.query for j in destination.client.list_jobs(all_users=True) if j.job_type == "query"]
    target = f"{destination.config.dataset}.{table_id(ORDERS.name)}` AS T WHERE"
    assert any(target + " T.`id` BETWEEN 3 AND 50 AND EXISTS" in q for q in scripts)  # the old key 50 too


def test_wide_numeric_dates_and_bytes_round_trip(destination: BigQueryDestination, kit: Any) -> None:
    import pyarrow as pa

    big = Decimal("12345678901234567890.123456789012345678")  # within the bigquery_emulator's BIGNUMERIC (38,18)
    rows = pa.table(
        {
            "id": pa.array([1, 2], pa.int32()),
            "big": pa.array([big, None], pa.decimal256(60, 30)),
            "day": pa.array([dt.date(1, 1, 1), dt.date(9999, 12, 31)], pa.date32()),
            "blob": pa.array([b"\x00\xff", None], pa.binary()),
        }
    )
    destination.write_table_rows(WIDE, rows)
    assert bq_rows(destination, WIDE) == [
        {"id": 1, "big": big, "day": dt.date(1, 1, 1), "blob": b"\x00\xff"},
        {"id": 2, "big": None, "day": dt.date(9999, 12, 31), "blob": None},
    ]


def test_value_out_of_range_errors_the_table(destination: BigQueryDestination, kit: Any) -> None:
    import pyarrow as pa

    rows = pa.table(
        {
            "id": pa.array([1], pa.int32()),
            "big": pa.array([None], pa.decimal256(60, 30)),
            "day": pa.array([2**31 - 1], pa.int32()).cast(pa.date32()),  # Postgres 'infinity'
            "blob": pa.array([None], pa.binary()),
        }
    )
    with pytest.raises(TableError, match="column day holds a value outside BigQuery's range") as error:
        destination.write_table_rows(WIDE, rows)
    assert error.value.table_id == WIDE.id

    b = kit.BatchBuilder()
    b.commit().insert(ORDERS, order(1, tags=[1, None]))
    with pytest.raises(TableError, match="NULL element") as error:
        destination.write_events(b.build())
    assert error.value.table_id == ORDERS.id

    b.commit().insert(ORDERS, order(2, doc='{"n": 18446744073709551616}'))  # 2**64: BigQuery JSON would round it
    with pytest.raises(TableError, match="column doc holds the JSON integer 184467440737") as error:
        destination.write_events(b.build())
    assert error.value.table_id == ORDERS.id
    dataset = f"{destination.config.project}.{destination.config.dataset}"
    assert table_id(ORDERS.name) not in [t.table_id for t in destination.client.list_tables(dataset)]  # untouched

    grid = replace(ORDERS, columns=(*ORDERS.columns, ColumnSchema("cells", 1007, type_name="integer[][]", attnum=8)))
    b.commit().insert(grid, order(3))  # the column is added by a schema change
    with pytest.raises(TableError, match="column cells is integer\\[\\]\\[\\], an array of 2 dimensions"):
        destination.write_events(b.build())
    grid = replace(grid, id=16603, name=TableName("public", "grid"))
    with pytest.raises(TableError, match="an array of 2 dimensions") as error:
        destination.write_table_rows(grid, kit.rows_table(ORDERS, [order(1)]))  # a new table
    assert error.value.table_id == grid.id


def test_a_failed_apply_changes_nothing(destination: BigQueryDestination, kit: Any) -> None:
    """Truncate, changes and watermark commit in one transaction: a statement failing halfway undoes them all. Of a
    batch of two tables, the one whose data BigQuery rejects errors alone: the other applies without it."""
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, [order(1), order(2)]))
    destination.write_table_rows(NOTES, kit.rows_table(NOTES, []))
    b = kit.BatchBuilder()
    b.commit().truncate(ORDERS).insert(ORDERS, order(3)).insert(ORDERS, order(4, doc="{not json"))
    b.insert(NOTES, {"body": "beside", "qty": 1, "doc": "{}"})
    batch = b.build()
    with pytest.raises(TableError, match="BigQuery rejected its data") as error:
        destination.write_events(batch)  # the truncate runs, then PARSE_JSON fails on row 4
    assert error.value.table_id == ORDERS.id
    assert [r["id"] for r in bq_rows(destination, ORDERS)] == [1, 2]
    assert bq_rows(destination, NOTES) == []
    ref = f"`{destination.config.project}.{destination.config.dataset}._etl_watermarks`"
    assert list(destination.client.query_and_wait(f"SELECT * FROM {ref}")) == []
    destination.write_events(batch.without_table(ORDERS.id))  # as the engine goes on
    assert [r["body"] for r in bq_rows(destination, NOTES)] == ["beside"]


def dml_jobs(destination: BigQueryDestination) -> float:
    """The query jobs that applied staged rows so far (``etl_bigquery_dml_seconds``' count)."""
    return destination.metrics.registry.get_sample_value("etl_bigquery_dml_seconds_count") or 0.0


def restarted(destination: BigQueryDestination) -> BigQueryDestination:
    """A new destination on the same dataset, as after a process restart (nothing kept in memory)."""
    destination.shutdown()
    again = BigQueryDestination.from_config(destination.config, DestinationContext(1, MemoryStore(1)))
    again.startup()
    return again


def test_columns_follow_attribute_numbers_across_restarts(destination: BigQueryDestination, kit: Any) -> None:
    destination.write_table_rows(ORDERS, kit.rows_table(ORDERS, [order(1), order(2)]))
    id_, note, _qty, *rest = ORDERS.columns

    # note renamed to comment and qty dropped at once, seen after a restart: the rename keeps note's values.
    renamed = replace(ORDERS, columns=(id_, replace(note, name="comment"), *rest))
    destination = restarted(destination)
    b = kit.BatchBuilder()
    b.commit().insert(renamed, {**order(3), "comment": "c3"})
    destination.write_events(b.build())
    assert {r["id"]: r["comment"] for r in bq_rows(destination, renamed)} == {1: "n1", 2: "n2", 3: "c3"}

    # comment dropped and remark (also text, where comment was) added: a new column, not a rename.
    reshaped = replace(renamed, columns=(id_, ColumnSchema("remark", 25, attnum=9), *rest))
    destination = restarted(destination)
    b.commit().insert(reshaped, {**order(4), "remark": "r4"})
    destination.write_events(b.build())
    assert {r["id"]: r["remark"] for r in bq_rows(destination, reshaped)} == {1: None, 2: None, 3: None, 4: "r4"}
    destination.shutdown()


NOTES = TableSchema(
    16602,
    TableName("public", "notes"),
    (ColumnSchema("body", 25, attnum=1), ColumnSchema("qty", 23, attnum=2), ColumnSchema("doc", 3802, attnum=3)),
    ReplicaIdentity.FULL,
)


def test_table_without_key_keeps_identical_rows_apart(destination: BigQueryDestination, kit: Any) -> None:
    def note(body: str, qty: int) -> dict[str, Any]:
        return {"body": body, "qty": qty, "doc": f'{{"q": [{qty}]}}'}

    reference = MemoryDestination()
    copied = [note("a", 1), note("a", 1), note("b", 2), note("c", 3)]
    for target in (destination, reference):
        target.write_table_rows(NOTES, kit.rows_table(NOTES, copied))
    b = kit.BatchBuilder()
    b.commit().delete(NOTES, note("a", 1))  # one of two identical rows
    b.update(NOTES, note("b", 20), old=note("b", 2))
    b.commit().insert(NOTES, note("d", 4)).insert(NOTES, note("d", 4)).insert(NOTES, note("c", 3))
    b.delete(NOTES, note("d", 4))
    batch = b.build()
    for target in (destination, reference):
        target.write_events(batch)
    expected = ref_rows(reference, NOTES)
    assert [(r["body"], r["qty"]) for r in expected] == [("a", 1), ("b", 20), ("c", 3), ("c", 3), ("d", 4)]
    assert bq_rows(destination, NOTES) == expected
    destination.write_events(batch)  # a replay changes nothing
    assert bq_rows(destination, NOTES) == expected

    b.commit().insert(NOTES, note("e", 5)).delete(NOTES, note("e", 5))  # nets to nothing
    destination.write_events(b.build())
    assert bq_rows(destination, NOTES) == expected

    b.commit().insert(NOTES, note("a", 1)).insert(NOTES, note("f", 6)).insert(NOTES, note("f", 6))  # inserts only
    destination.write_events(b.build())
    assert [(r["body"], r["qty"]) for r in bq_rows(destination, NOTES)] == [
        ("a", 1),
        ("a", 1),
        ("b", 20),
        ("c", 3),
        ("c", 3),
        ("d", 4),
        ("f", 6),
        ("f", 6),
    ]


def test_target_tables_are_clustered_by_their_key_and_partitioned_when_asked(
    bigquery_emulator: BigQueryEmulator, spark: Any, kit: Any
) -> None:
    events = TableSchema(
        16610,
        TableName("public", "events"),
        (
            ColumnSchema("tenant", 23, nullable=False, primary_key=True),
            ColumnSchema("id", 20, nullable=False, primary_key=True),
            ColumnSchema("at", 1184),
        ),
    )
    target = kit.make_bigquery(bigquery_emulator, "d_clustered", partition_by={"public.events": "at"})
    b = kit.BatchBuilder()
    target.write_events(
        b.commit().insert(events, {"tenant": 1, "id": 7, "at": dt.datetime(2026, 11, 24, 10, tzinfo=dt.UTC)}).build()
    )
    table = target.client.get_table(f"{PROJECT}.d_clustered.{table_id(events.name)}")
    assert table.clustering_fields == ["tenant", "id"]
    assert table.time_partitioning is not None and table.time_partitioning.field == "at"
    assert len(bq_rows(target, events)) == 1


CODES = TableSchema(
    16604,
    TableName("public", "codes"),
    (ColumnSchema("code", 25, nullable=False, primary_key=True, attnum=1), ColumnSchema("n", 23, attnum=2)),
)


def staging_tables(destination: BigQueryDestination) -> list[str]:
    dataset = f"{destination.config.project}.{destination.config.dataset}"
    return [t.table_id for t in destination.client.list_tables(dataset) if t.table_id.startswith("_etl_staging_")]


def test_a_batch_of_many_tables_is_staged_by_one_load_job(destination: BigQueryDestination, kit: Any) -> None:
    """Keyed rows with unchanged TOAST values, rows without a key and a schema change, in one batch: one load
    job per round of segments, not one per table; every staging table dropped after use."""
    reference = MemoryDestination()
    for target in (destination, reference):
        target.write_table_rows(ORDERS, kit.rows_table(ORDERS, [order(1), order(2)]))
        target.write_table_rows(NOTES, kit.rows_table(NOTES, [{"body": "a", "qty": 1, "doc": "{}"}]))
    copies = destination.metrics.load_jobs.labels("public.order_items")._value.get()
    assert copies == 1

    b = kit.BatchBuilder()
    b.commit().update(ORDERS, order(1, qty=10), missing=("note",)).insert(ORDERS, order(3))
    b.delete(NOTES, {"body": "a", "qty": 1, "doc": "{}"}).insert(NOTES, {"body": "b", "qty": 2, "doc": "{}"})
    b.commit().insert(CODES, {"code": "x", "n": 1})
    batch = b.build()
    applies = dml_jobs(destination)
    for target in (destination, reference):
        target.write_events(batch)
    assert destination.metrics.load_jobs.labels("*")._value.get() == 1  # three tables, one load
    assert dml_jobs(destination) == applies + 1, "three tables, one transaction"
    for schema in (ORDERS, NOTES):
        assert bq_rows(destination, schema) == ref_rows(reference, schema)
    assert bq_rows(destination, CODES) == [{"code": "x", "n": 1}]
    ref = f"`{destination.config.project}.{destination.config.dataset}._etl_positions`"
    assert [tuple(r) for r in destination.client.query_and_wait(f"SELECT pipeline_id, commit_lsn, lsn FROM {ref}")] == [
        (1, int(batch.last_commit_lsn), str(batch.last_commit_lsn))
    ]

    # A column added to ORDERS inside the next batch: two segments of it, so two rounds, two loads.
    extended = replace(ORDERS, columns=(*ORDERS.columns, ColumnSchema("extra", 25, attnum=8)))
    b.commit().insert(ORDERS, order(4)).insert(NOTES, {"body": "c", "qty": 3, "doc": "{}"})
    b.commit().insert(extended, {**order(5), "extra": "e5"})
    batch = b.build()
    assert len(batch.changes[ORDERS.id]) == 2
    destination.write_events(batch)
    assert destination.metrics.load_jobs.labels("*")._value.get() == 3
    assert {r["id"]: r["extra"] for r in bq_rows(destination, extended)} == {
        1: None,
        2: None,
        3: None,
        4: None,
        5: "e5",
    }
    assert [r["body"] for r in bq_rows(destination, NOTES)] == ["b", "c"]
    assert staging_tables(destination) == []


def test_staging_tables_left_by_a_crash_are_dropped_at_start(destination: BigQueryDestination) -> None:
    dataset = f"{destination.config.project}.{destination.config.dataset}"
    for name in ("_etl_staging_1_left", "_etl_staging_12_other_pipeline"):
        destination.client.query_and_wait(f"CREATE TABLE `{dataset}.{name}` (x INT64)")
    again = restarted(destination)
    try:
        assert staging_tables(again) == ["_etl_staging_12_other_pipeline"]
    finally:
        again.shutdown()


def test_history_mode_appends_every_change_once(destination: BigQueryDestination, kit: Any) -> None:
    historic = BigQueryDestination.from_config(
        destination.config.model_copy(update={"mode": "history"}), DestinationContext(1, MemoryStore(1))
    )
    historic.startup()
    try:
        historic.write_table_rows(ORDERS, kit.rows_table(ORDERS, [order(1), order(2)]))
        b = kit.BatchBuilder()
        b.commit().insert(ORDERS, order(3)).update(ORDERS, order(1, qty=10))
        b.commit().update(ORDERS, order(20, note="n2"), old={"id": 2})  # key change
        b.delete(ORDERS, {"id": 3})
        b.commit().truncate(ORDERS).insert(ORDERS, order(4))
        batch = b.build()
        historic.write_events(batch)
        historic.write_events(batch)  # a replay adds nothing
        b.commit().update(ORDERS, order(4, qty=40), missing=("note",))
        historic.write_events(b.build())

        ref = f"`{PROJECT}.{historic.config.dataset}.{table_id(ORDERS.name)}`"
        rows = [
            dict(r.items())
            for r in historic.client.query_and_wait(
                f"SELECT id, qty, note, _etl_op, _etl_commit_lsn, _etl_tx_ordinal, _etl_commit_ts FROM {ref}"
                " ORDER BY _etl_commit_lsn NULLS FIRST, _etl_tx_ordinal, id"
            )
        ]
        assert [(r["_etl_op"], r["id"], r["qty"]) for r in rows] == [
            ("copy", 1, 1),
            ("copy", 2, 2),
            ("insert", 3, 3),
            ("update", 1, 10),
            ("delete", 2, None),  # the key change 2 -> 20: the old key ends, ...
            ("update", 20, 20),  # ... the new row goes on (at the same position)
            ("delete", 3, None),  # a delete's row: the old key
            ("truncate", None, None),
            ("insert", 4, 4),
            ("update", 4, 40),
        ]
        assert rows[-1]["note"] is None  # an unchanged TOAST value that was not sent
        assert all(r["_etl_commit_ts"] is None and r["_etl_commit_lsn"] is None for r in rows[:2])
        assert all(r["_etl_commit_ts"] == kit.commit_time(r["_etl_commit_lsn"]) for r in rows[2:])
        assert [r["_etl_tx_ordinal"] for r in rows[2:4]] == [0, 1]  # 0-based, as the engine numbers changes

        # A column dropped at the source stays, renamed: the earlier rows keep their values.
        fewer = replace(ORDERS, columns=tuple(c for c in ORDERS.columns if c.name != "qty"))
        historic.write_events(b.commit().insert(fewer, order(6)).build())
        kept = sorted(
            (r["id"], r["_etl_dropped_3_qty"])
            for r in historic.client.query_and_wait(f"SELECT id, _etl_dropped_3_qty FROM {ref} WHERE id IN (1, 6)")
        )
        assert kept == [(1, 1), (1, 10), (6, None)]  # id 1's copy and update keep their qty; id 6 has none
        columns = [f.name for f in historic.client.get_table(ref.strip("`")).schema]
        assert "qty" not in columns and "_etl_dropped_3_qty" in columns

        # The same dataset in apply mode: the history table is not taken for a mirror.
        applying = historic.config.model_copy(update={"mode": "apply"})
        mirror = BigQueryDestination.from_config(applying, DestinationContext(1, MemoryStore(1)))
        mirror.startup()
        try:
            with pytest.raises(TableError, match="written in history mode") as error:
                mirror.write_events(b.commit().insert(ORDERS, order(5)).build())
            assert error.value.table_id == ORDERS.id
        finally:
            mirror.shutdown()
    finally:
        historic.shutdown()
