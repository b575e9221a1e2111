"""SchemaTracker: versions from RELATION and DDL trigger messages, and the rename heuristic (no server needed)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from etl.lsn import Lsn
from etl.postgres import pgoutput as pg
from etl.postgres.ddl import SchemaChange, TriggerColumn
from etl.replication.schemas import SchemaTracker
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl.store.memory import MemoryStore

T = 16384
INT, TEXT = 23, 25


def copied(*columns: ColumnSchema, identity: ReplicaIdentity = ReplicaIdentity.DEFAULT) -> TableSchema:
    return TableSchema(T, TableName("public", "t"), columns, identity, Lsn(10))


def relation(*columns: tuple[str, int, bool], identity: ReplicaIdentity = ReplicaIdentity.DEFAULT) -> pg.Relation:
    return pg.Relation(
        T, "public", "t", identity, tuple(pg.RelationColumn(key, name, oid, -1) for name, oid, key in columns)
    )


def tracker_with(schema: TableSchema, publication: str | None = None) -> tuple[SchemaTracker, MemoryStore]:
    store = MemoryStore(pipeline_id=1)
    store.store_table_schema(schema)
    return SchemaTracker(store, publication), store


BASE = copied(
    ColumnSchema("id", INT, nullable=False, primary_key=True, type_name="integer", attnum=1),
    ColumnSchema("a", TEXT, nullable=False, type_name="text", attnum=2, default="'x'::text"),
    ColumnSchema("b", INT, type_name="integer", attnum=3),
)


def test_relation_that_repeats_the_current_version_adds_none() -> None:
    tracker, store = tracker_with(BASE)
    assert tracker.observe(relation(("id", INT, True), ("a", TEXT, False), ("b", INT, False)), Lsn(20)) is None
    assert store.get_table_schema(T) == BASE


def test_rename_in_place_keeps_what_is_known_of_the_column() -> None:
    tracker, store = tracker_with(BASE)
    schema = tracker.observe(relation(("id", INT, True), ("a2", TEXT, False), ("b", INT, False)), Lsn(20))
    assert schema is not None
    assert schema.columns[1] == ColumnSchema(
        "a2", TEXT, nullable=False, type_name="text", attnum=2, default="'x'::text"
    )
    assert store.get_table_schema(T) == schema


@pytest.mark.parametrize(
    ("columns", "why"),
    [
        ((("id", INT, True), ("a2", INT, False), ("b", INT, False)), "the type changed too"),
        ((("id", INT, True), ("b", TEXT, False), ("a", INT, False)), "names swapped, types differ"),
        ((("id", INT, True), ("a", TEXT, False)), "a column fewer: a drop"),
        ((("id", INT, True), ("a", TEXT, False), ("b", INT, False), ("c", INT, False)), "a column more: an add"),
        ((("id", INT, True), ("a", TEXT, False), ("a", INT, False)), "the new name was taken"),
    ],
)
def test_no_rename_unless_only_names_changed_in_place(columns: tuple[tuple[str, int, bool], ...], why: str) -> None:
    tracker, _ = tracker_with(BASE)
    schema = tracker.observe(relation(*columns), Lsn(20))
    assert schema is not None, why
    by_name = {c.name: c for c in BASE.columns}
    for column in schema.columns:
        before = by_name.get(column.name)
        expected = before.attnum if before is not None else None
        assert column.attnum == expected, why


def change(*columns: ColumnSchema, publications: dict[str, tuple[str, ...] | None] | None = None) -> SchemaChange:
    return SchemaChange(
        T,
        TableName("public", "t"),
        ReplicaIdentity.DEFAULT,
        tuple(TriggerColumn(c, "") for c in columns),
        {"pub": None} if publications is None else publications,
        150000,
    )


def test_trigger_version_then_matching_relation_adds_one_version() -> None:
    tracker, store = tracker_with(BASE)
    new = (*BASE.columns[:2], ColumnSchema("b", INT, nullable=False, type_name="integer", attnum=3, default="0"))
    schema = tracker.observe_ddl(change(*new), Lsn(30))
    assert schema is not None and schema.columns == new and schema.snapshot_lsn == Lsn(30)
    assert tracker.observe(relation(("id", INT, True), ("a", TEXT, False), ("b", INT, False)), Lsn(30)) is None
    assert tracker.current(T) == schema == store.get_table_schema(T)
    assert tracker.observe_ddl(change(*new), Lsn(40)) is None  # the same shape again: no version


def test_trigger_message_keeps_the_publications_columns() -> None:
    tracker, _ = tracker_with(BASE, publication="narrow")
    added = (*BASE.columns, ColumnSchema("c", INT, attnum=4))
    assert tracker.observe_ddl(change(*added, publications={"narrow": ("id", "a", "b")}), Lsn(30)) is None
    b_default = ColumnSchema("b", INT, type_name="integer", attnum=3, default="5")
    columns = (*BASE.columns[:2], b_default, added[3])
    schema = tracker.observe_ddl(change(*columns, publications={"narrow": ("id", "a", "b")}), Lsn(35))
    assert schema is not None and schema.columns == (*BASE.columns[:2], b_default)
    assert tracker.observe_ddl(change(*columns, publications={"other": None}), Lsn(40)) is None


def test_nothing_identity_ignores_the_key_flags_it_does_not_send() -> None:
    nothing = copied(*BASE.columns, identity=ReplicaIdentity.NOTHING)
    tracker, _ = tracker_with(nothing)
    msg = relation(("id", INT, False), ("a", TEXT, False), ("b", INT, False), identity=ReplicaIdentity.NOTHING)
    assert tracker.observe(msg, Lsn(20)) is None
    renamed = relation(("id", INT, False), ("a", TEXT, False), ("b2", INT, False), identity=ReplicaIdentity.NOTHING)
    schema = tracker.observe(renamed, Lsn(30))
    assert schema is not None and schema.key_columns == [BASE.columns[0]]  # the primary key is kept


def test_later_versions_keep_the_partitions_the_copy_read() -> None:
    """A message does not say which leaves the destination holds the rows of: the copy's record goes on."""
    tracker, store = tracker_with(replace(BASE, partitions=(16390, 16400), attachments=((16390, 7), (16400, 9))))
    schema = tracker.observe(relation(("id", INT, True), ("a", TEXT, False)), Lsn(20))
    assert schema is not None and schema.partitions == (16390, 16400)
    assert schema.attachments == ((16390, 7), (16400, 9))
    tracker.record_partitions(T, (16390,), ((16390, 12),))
    assert store.get_table_schema(T) == replace(schema, partitions=(16390,), attachments=((16390, 12),))
