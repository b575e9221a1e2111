"""ChangeBuilder: decoded pgoutput changes from a real Postgres -> columnar EventBatch and ordered events."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from etl.errors import TableError
from etl.events import (
    MISSING,
    BeginEvent,
    CommitEvent,
    DeleteEvent,
    EventBatch,
    InsertEvent,
    RelationEvent,
    TruncateEvent,
    UpdateEvent,
)
from etl.lsn import Lsn
from etl.postgres import pgoutput as pg
from etl.postgres.codecs import INT32_MAX
from etl.replication.changes import ChangeBuilder
from etl.replication.segment import change_schema
from etl.schema import ColumnSchema, TableName, TableSchema
from etl.testing.pgoutput_capture import capture
from etl.testing.pytest_plugin import TestDatabase

Conn = psycopg.Connection[Any]


def schema_of_relation(message: pg.Relation) -> TableSchema:
    columns = tuple(ColumnSchema(c.name, c.type_oid, c.type_modifier, primary_key=c.flags_key) for c in message.columns)
    return TableSchema(message.oid, TableName(message.namespace, message.name), columns, message.replica_identity)


class Feeder:
    """Drives a ChangeBuilder from decoded messages the way the apply worker does."""

    def __init__(self) -> None:
        self.schemas: dict[int, TableSchema] = {}
        self.builder = ChangeBuilder(self.schemas.__getitem__)
        self.final_lsn = Lsn.ZERO
        self.commits: list[pg.Commit] = []
        self.begins: list[pg.Begin] = []

    def feed(self, messages: list[pg.Message], until: Callable[[pg.Message], bool] | None = None) -> list[pg.Message]:
        """Feed messages; stop before the first one ``until`` accepts and return the rest."""
        b = self.builder
        for index, m in enumerate(messages):
            if until is not None and until(m):
                return messages[index:]
            if isinstance(m, pg.Begin):
                self.final_lsn = m.final_lsn
                self.begins.append(m)
                b.begin(m.xid, m.final_lsn, m.commit_ts, m.final_lsn)
            elif isinstance(m, pg.Commit):
                self.commits.append(m)
                b.commit(m.commit_lsn, m.end_lsn, m.commit_ts, m.commit_lsn)
            elif isinstance(m, pg.Relation):
                schema = schema_of_relation(m)
                known = self.schemas.get(m.oid)
                self.schemas[m.oid] = schema
                if known is not None and known != schema:
                    b.relation(schema, self.final_lsn)
            elif isinstance(m, pg.Insert):
                b.insert(m.relation_oid, m.new, self.final_lsn)
            elif isinstance(m, pg.Update):
                b.update(m.relation_oid, m.old_kind, m.old, m.new, self.final_lsn)
            elif isinstance(m, pg.Delete):
                b.delete(m.relation_oid, m.old_kind, m.old, self.final_lsn)
            elif isinstance(m, pg.Truncate):
                b.truncate(m.relation_oids, m.cascade, m.restart_identity, self.final_lsn)
        return []


def decoded(payloads: list[bytes]) -> list[pg.Message]:
    decoder = pg.PgOutputDecoder(1)
    return [decoder.decode(p) for p in payloads]


def table_oid(conn: Conn, name: str) -> int:
    row = conn.execute("SELECT %s::regclass::oid::int", (name,)).fetchone()
    assert row is not None
    return int(row[0])


BIG = "ü" * 3000  # stored out of line: an update that does not touch it sends it as unchanged TOAST

SETUP = (
    "CREATE TABLE t (id int PRIMARY KEY, name text, amount numeric(10, 2), at timestamptz, day date, big text);"
    "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL;"
    "CREATE TABLE f (id int, tags text[], big text);"
    "ALTER TABLE f ALTER COLUMN big SET STORAGE EXTERNAL;"
    "ALTER TABLE f REPLICA IDENTITY FULL"
)


def workload(facts: dict[str, Any]) -> Callable[[Conn], None]:
    def run(conn: Conn) -> None:
        with conn.transaction():
            conn.execute(
                "INSERT INTO t VALUES (1, 'one', 12.50, '2024-02-29 12:00:00.5+00', 'infinity', %s),"
                " (2, NULL, NULL, NULL, '0044-03-15 BC', NULL)",
                (BIG,),
            )
            conn.execute("INSERT INTO f VALUES (1, '{a,\"b c\",NULL}', %s)", (BIG,))
        facts["after_insert"] = conn.execute("SELECT id, name, amount, at, big FROM t ORDER BY id").fetchall()
        with conn.transaction():
            conn.execute("UPDATE t SET name = 'uno' WHERE id = 1")  # big: unchanged TOAST, no old row
            conn.execute("UPDATE t SET id = 10 WHERE id = 2")  # key change: old key sent
            conn.execute("UPDATE f SET tags = '{}'")  # FULL: old row sent, big recovered from it
            conn.execute("DELETE FROM t WHERE id = 10")
            conn.execute("DELETE FROM f")
        conn.execute("TRUNCATE t, f")
        conn.execute("CREATE TEMP TABLE nothing_published (x int); INSERT INTO nothing_published VALUES (1)")
        facts.update(t=table_oid(conn, "t"), f=table_oid(conn, "f"))

    return run


@pytest.fixture
def stream(pg_database: TestDatabase) -> tuple[list[pg.Message], dict[str, Any]]:
    facts: dict[str, Any] = {}
    return decoded(capture(pg_database, workload(facts), setup=SETUP)), facts


def test_columnar_changes_and_ordered_events(stream: tuple[list[pg.Message], dict[str, Any]]) -> None:
    messages, facts = stream
    feeder = Feeder()
    feeder.feed(messages)
    builder = feeder.builder
    assert not builder.is_empty and builder.has_commits and not builder.in_transaction
    batch = builder.build()
    assert builder.is_empty and not builder.has_commits
    t_oid, f_oid = facts["t"], facts["f"]
    insert_tx, change_tx, truncate_tx = feeder.begins
    assert batch.last_commit_lsn == feeder.commits[-1].end_lsn
    assert batch.table_ids == [t_oid, f_oid]

    (t_changes,) = batch.changes[t_oid]
    t = t_changes.table
    assert t.schema == change_schema(feeder.schemas[t_oid])
    assert t.schema.field("amount").type == pa.decimal128(10, 2)
    assert t.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert t.column("_etl_op").to_pylist() == ["I", "I", "U", "U", "D", "T"]
    lsns = [insert_tx.final_lsn] * 2 + [change_tx.final_lsn] * 3 + [truncate_tx.final_lsn]
    assert t.column("_etl_commit_lsn").to_pylist() == lsns
    # ordinals count the changes of each transaction across tables: f's insert is 2nd of tx 1
    assert t.column("_etl_tx_ordinal").to_pylist() == [0, 1, 0, 1, 3, 0]
    assert t.column("id").to_pylist() == [1, 2, 1, 10, 10, None]
    assert t.column("name").to_pylist() == ["one", None, "uno", None, None, None]
    assert t.column("day").cast(pa.int32()).to_pylist()[:2] == [INT32_MAX, -735_160]  # infinity; 44 BC
    # the unchanged TOAST value of the first update was not sent: null in the row, named in _etl_missing
    assert t.column("big").to_pylist() == [BIG, None, None, None, None, None]
    assert t.column("_etl_missing").to_pylist() == [None, None, ["big"], None, None, None]
    old = t.column("_etl_old").to_pylist()
    assert old[:2] == [None, None] and old[2] is None  # no old row for a plain update under REPLICA IDENTITY DEFAULT
    assert old[3] == {"id": 2, "name": None, "amount": None, "at": None, "day": None, "big": None}
    assert t.column("_etl_old_is_key").to_pylist() == [None, None, False, True, True, None]

    (f_changes,) = batch.changes[f_oid]
    f = f_changes.table
    assert f.column("_etl_op").to_pylist() == ["I", "U", "D", "T"]
    assert f.column("tags").to_pylist() == [["a", "b c", None], [], [], None]
    assert f.column("big").to_pylist() == [BIG, BIG, BIG, None]  # FULL: the update's TOAST value came with the old row
    assert f.column("_etl_missing").to_pylist() == [None, None, None, None]
    assert f.column("_etl_old").to_pylist()[1] == {"id": 1, "tags": ["a", "b c", None], "big": BIG}
    assert f.column("_etl_old_is_key").to_pylist() == [None, False, False, None]

    # Values agree with what Postgres returns for the same rows.
    inserts = [e for e in batch.events() if isinstance(e, InsertEvent) and e.table_id == t_oid]
    assert [(e.row[0], e.row[1], e.row[2], e.row[3], e.row[5]) for e in inserts] == facts["after_insert"]


def test_events_in_source_order(stream: tuple[list[pg.Message], dict[str, Any]]) -> None:
    messages, facts = stream
    feeder = Feeder()
    feeder.feed(messages)
    events = list(feeder.builder.build().events())
    t_oid, f_oid = facts["t"], facts["f"]
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "BeginEvent",
        "InsertEvent",
        "InsertEvent",
        "InsertEvent",
        "CommitEvent",
        "BeginEvent",
        "UpdateEvent",
        "UpdateEvent",
        "UpdateEvent",
        "DeleteEvent",
        "DeleteEvent",
        "CommitEvent",
        "BeginEvent",
        "TruncateEvent",
        "CommitEvent",
    ]  # fmt: skip  -- the temp-table transaction published nothing and produced no events
    begin, first, *_ = events
    insert_tx = feeder.begins[0]
    assert begin == BeginEvent(insert_tx.final_lsn, insert_tx.final_lsn, 0, insert_tx.xid, insert_tx.commit_ts)
    assert first == InsertEvent(
        insert_tx.final_lsn, insert_tx.final_lsn, 0, t_oid,
        (1, "one", Decimal("12.50"), datetime(2024, 2, 29, 12, 0, 0, 500_000, UTC), "infinity", BIG),
    )  # fmt: skip
    assert events[2].row[4] == "0044-03-15 BC"  # type: ignore[union-attr]  # outside Python's dates: Postgres text
    commit = events[4]
    assert isinstance(commit, CommitEvent) and commit.tx_ordinal == 3 and commit.end_lsn == feeder.commits[0].end_lsn

    toast_update, key_update, full_update, t_delete, f_delete = events[6:11]
    assert isinstance(toast_update, UpdateEvent) and toast_update.table_id == t_oid
    assert toast_update.row[5] is MISSING and toast_update.row[:2] == (1, "uno") and toast_update.old_row is None
    assert isinstance(key_update, UpdateEvent)
    assert key_update.old_is_key and key_update.old_row == (2, None, None, None, None, None)
    assert isinstance(full_update, UpdateEvent) and full_update.table_id == f_oid and not full_update.old_is_key
    assert full_update.row == (1, [], BIG) and full_update.old_row == (1, ["a", "b c", None], BIG)
    assert t_delete == DeleteEvent(
        t_delete.start_lsn, feeder.begins[1].final_lsn, 3, t_oid, (10, None, None, None, None, None), True
    )
    assert isinstance(f_delete, DeleteEvent) and f_delete.old_row == (1, [], BIG) and not f_delete.old_is_key
    truncate = events[13]
    assert isinstance(truncate, TruncateEvent) and truncate.table_ids == (t_oid, f_oid)
    assert (truncate.cascade, truncate.restart_identity) == (False, False)


def test_a_batch_may_end_inside_a_transaction(stream: tuple[list[pg.Message], dict[str, Any]]) -> None:
    messages, facts = stream
    feeder = Feeder()
    seen_updates = 0

    def second_update(m: pg.Message) -> bool:
        nonlocal seen_updates
        seen_updates += isinstance(m, pg.Update)
        return seen_updates == 2

    rest = feeder.feed(messages, until=second_update)
    builder = feeder.builder
    assert builder.in_transaction
    first = builder.build()
    assert first.last_commit_lsn == feeder.commits[0].end_lsn  # the transaction in progress has not committed
    assert builder.in_transaction and builder.is_empty
    feeder.feed(rest)
    second = builder.build()
    assert second.last_commit_lsn == feeder.commits[-1].end_lsn

    change_tx = feeder.begins[1]
    first_events, second_events = list(first.events()), list(second.events())
    assert isinstance(first_events[-1], UpdateEvent) and first_events[-1].tx_ordinal == 0
    assert isinstance(first_events[-2], BeginEvent) and first_events[-2].xid == change_tx.xid
    assert [e.tx_ordinal for e in second_events[:5]] == [1, 2, 3, 4, 5]  # the same sequence goes on
    assert {e.commit_lsn for e in second_events[:5]} == {change_tx.final_lsn}
    assert isinstance(second_events[4], CommitEvent)
    t_second = second.changes[facts["t"]][0].table
    assert t_second.column("_etl_tx_ordinal").to_pylist() == [1, 3, 0]

    # Every change's commit time, by its commit LSN, in both batches (Postgres sends it at BEGIN).
    for batch in (first, second):
        lsns = {
            lsn
            for segments in batch.changes.values()
            for s in segments
            for lsn in s.table["_etl_commit_lsn"].to_pylist()
        }
        begins = {int(b.final_lsn): b.commit_ts for b in feeder.begins}
        assert lsns and {lsn: batch.commit_timestamps[lsn] for lsn in lsns} == {lsn: begins[lsn] for lsn in lsns}
    assert change_tx.final_lsn in first.commit_timestamps and change_tx.final_lsn in second.commit_timestamps


def test_schema_change_starts_a_new_segment(pg_database: TestDatabase) -> None:
    def run(conn: Conn) -> None:
        conn.execute("INSERT INTO s VALUES (1, 'a')")
        with conn.transaction():
            conn.execute("INSERT INTO s VALUES (2, 'b')")
            conn.execute("ALTER TABLE s ADD COLUMN n numeric(4, 1), DROP COLUMN v")
            conn.execute("INSERT INTO s VALUES (3, 1.5)")

    messages = decoded(capture(pg_database, run, setup="CREATE TABLE s (id int PRIMARY KEY, v text)"))
    feeder = Feeder()
    feeder.feed(messages)
    batch = feeder.builder.build()
    (table_id,) = batch.table_ids
    before, after = batch.changes[table_id]
    assert before.schema.column_names == ["id", "v"] and after.schema.column_names == ["id", "n"]
    assert before.table.column("v").to_pylist() == ["a", "b"]
    assert after.table.column("n").to_pylist() == [Decimal("1.5")]
    assert after.table.column("_etl_tx_ordinal").to_pylist() == [1]
    events = list(batch.events())
    relation = next(i for i, e in enumerate(events) if isinstance(e, RelationEvent))
    assert isinstance(events[relation + 1], InsertEvent) and events[relation + 1].row == (3, Decimal("1.5"))  # type: ignore[union-attr]
    assert events[relation].tx_ordinal == 1 and events[relation].schema == after.schema  # type: ignore[union-attr]


def test_unconvertible_table_can_be_discarded(pg_database: TestDatabase) -> None:
    def run(conn: Conn) -> None:
        with conn.transaction():
            conn.execute("INSERT INTO good VALUES (1)")
            conn.execute("INSERT INTO bad VALUES ('NaN')")
            conn.execute("TRUNCATE good, bad")
            conn.execute("INSERT INTO good VALUES (2)")

    setup = "CREATE TABLE good (id int); CREATE TABLE bad (n numeric(5, 2))"
    messages = decoded(capture(pg_database, run, setup=setup))
    feeder = Feeder()
    feeder.feed(messages)
    bad = next(m.oid for m in messages if isinstance(m, pg.Relation) and m.name == "bad")
    good = next(m.oid for m in messages if isinstance(m, pg.Relation) and m.name == "good")
    builder = feeder.builder
    with pytest.raises(TableError, match=r"table public\.bad: column 'n'.*NaN") as error:
        builder.build()
    assert error.value.table_id == bad
    builder.discard_table(bad)
    batch = builder.build()
    assert batch.table_ids == [good]
    assert batch.changes[good][0].table.column("_etl_op").to_pylist() == ["I", "T", "I"]
    events = list(batch.events())
    assert [type(e) for e in events] == [BeginEvent, InsertEvent, TruncateEvent, InsertEvent, CommitEvent]
    assert events[2].table_ids == (good,)  # type: ignore[union-attr]
    assert batch.last_commit_lsn == feeder.commits[-1].end_lsn


def test_size_estimate_and_state() -> None:
    schema = TableSchema(7, TableName("public", "x"), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("v", 25)))
    builder = ChangeBuilder(lambda table_id: schema)
    at = datetime(2024, 1, 1, tzinfo=UTC)
    assert builder.is_empty and builder.size_bytes == 0 and not builder.in_transaction
    builder.begin(1, Lsn(100), at, Lsn(100))
    assert builder.in_transaction and builder.is_empty
    builder.insert(7, ("1", "x" * 1000), Lsn(100))
    one = builder.size_bytes
    assert one > 1000
    builder.insert(7, ("2", "y" * 1000), Lsn(100))
    assert builder.size_bytes >= 2 * one - 10
    builder.commit(Lsn(100), Lsn(130), at, Lsn(100))
    batch: EventBatch = builder.build()
    assert batch.row_count() == 2 and builder.size_bytes == 0 and builder.is_empty
    # an empty transaction moves last_commit_lsn without producing events
    builder.begin(2, Lsn(200), at, Lsn(200))
    builder.commit(Lsn(200), Lsn(230), at, Lsn(200))
    assert builder.is_empty and builder.has_commits
    empty = builder.build()
    assert empty.last_commit_lsn == Lsn(230) and list(empty.events()) == [] and empty.changes == {}


def test_a_run_of_inserts_builds_as_the_same_inserts_one_by_one() -> None:
    schema = TableSchema(7, TableName("public", "x"), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("v", 25)))
    at = datetime(2024, 1, 1, tzinfo=UTC)
    rows = [pg.TupleData.of((str(i), None if i % 3 else f"v{i}")) for i in range(7)]
    batches = []
    for at_once in (False, True):
        builder = ChangeBuilder(lambda table_id: schema)
        builder.begin(1, Lsn(100), at, Lsn(100))
        builder.insert(7, ("-1", "first"), Lsn(100))
        if at_once:
            builder.insert_tuples(7, [r.data for r in rows], rows[0].start, Lsn(100))
        else:
            for row in rows:
                builder.insert_tuple(7, row.data, row.start, Lsn(100))
        builder.delete(7, "K", ("3", None), Lsn(100))
        builder.commit(Lsn(100), Lsn(130), at, Lsn(100))
        batches.append((builder.size_bytes, builder.build()))
    (size_one, one), (size_run, run) = batches
    assert size_run == size_one
    assert run.changes[7][0].table.equals(one.changes[7][0].table)
    assert list(run.events()) == list(one.events())


def test_a_column_named_like_a_change_table_column_errors_its_table() -> None:
    schema = TableSchema(
        7, TableName("public", "x"), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("_etl_op", 25))
    )
    builder = ChangeBuilder(lambda table_id: schema)
    builder.begin(1, Lsn(100), datetime(2024, 1, 1, tzinfo=UTC), Lsn(100))
    builder.insert(7, ("1", "x"), Lsn(100))
    with pytest.raises(TableError, match=r"table public\.x: column _etl_op has the name of a column the engine adds"):
        builder.build()


def test_parted_holds_a_tables_changes_from_the_first_at_its_bound_in_both_views(pg_database: TestDatabase) -> None:
    """``EventBatch.parted``, as an incremental copy holds a table's changes for its chunk: from the first change at
    or after the bound on, everything of the table is held, a new schema version included, in the columns and in
    the events alike; with ``holding`` (an earlier batch's were held) all of it, so none of it overtakes them."""

    def run(conn: Conn) -> None:
        conn.execute("INSERT INTO s VALUES (1, 'a')")
        conn.execute("INSERT INTO s VALUES (2, 'b')")
        with conn.transaction():
            conn.execute("ALTER TABLE s ADD COLUMN n int")
            conn.execute("INSERT INTO s VALUES (3, 'c', 7)")
        conn.execute("INSERT INTO other VALUES (1)")

    setup = "CREATE TABLE s (id int PRIMARY KEY, v text); CREATE TABLE other (id int PRIMARY KEY)"
    feeder = Feeder()
    feeder.feed(decoded(capture(pg_database, run, setup=setup)))
    batch = feeder.builder.build()
    table_id = next(t for t in batch.table_ids if batch.changes[t][0].schema.name.name == "s")
    second = feeder.commits[1].commit_lsn

    def ids(part: EventBatch) -> tuple[list[int], list[int]]:
        """The table's ids in the columns and in the events."""
        columns = [i for seg in part.changes.get(table_id, []) for i in seg.table.column("id").to_pylist()]
        events = [e.row[0] for e in part.events() if isinstance(e, InsertEvent) and e.table_id == table_id]
        return columns, events

    rest, held = batch.parted(table_id, second)
    assert held is not None and ids(rest) == ([1], [1]) and ids(held) == ([2, 3], [2, 3])
    assert [s.schema.column_names for s in held.changes[table_id]] == [["id", "v"], ["id", "v", "n"]]
    assert sum(isinstance(e, RelationEvent) for e in held.events()) == 1  # after the first held change: held
    assert held.last_commit_lsn == Lsn.ZERO and rest.last_commit_lsn == batch.last_commit_lsn
    assert len(rest.changes) == 2 and not rest.all_tables_ready  # the other table stays

    rest, held = batch.parted(table_id, Lsn(int(feeder.commits[-1].end_lsn) + 1), holding=True)
    assert held is not None and ids(rest) == ([], []) and ids(held) == ([1, 2, 3], [1, 2, 3])
    assert table_id not in rest.changes and not any(isinstance(e, RelationEvent) for e in rest.events())
    assert batch.parted(table_id, Lsn(int(feeder.commits[-1].end_lsn) + 1)) == (batch, None)  # nothing that late
