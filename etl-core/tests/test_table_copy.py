"""The initial copy against a real Postgres: COPY of ctid ranges into Arrow, serial and parallel."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
import structlog

from etl.config import PostgresConnection
from etl.copy_plan import CopyPlan, CopyRange, CtidRange
from etl.errors import SourceError, TableError
from etl.key_chunk import KeyChunk
from etl.postgres.catalog import PublishedTable, ctid_ranges, publication_tables, table_schema
from etl.postgres.codecs import arrow_field
from etl.postgres.connection import connect
from etl.postgres.copy import copy_chunk, copy_table, plan_copy, read_ranges
from etl.postgres.copy_session import ChunkKeys
from etl.postgres.replication import ReplicationConnection
from etl.schema import TableName, TableSchema
from etl.testing.pipelines import poll
from etl.testing.pytest_plugin import TestDatabase

# Values are compared as text so the comparison holds whatever Arrow type the codecs pick for int and text.
Row = tuple[str | None, ...]


def normalize(rows: Iterable[Iterable[Any]]) -> Counter[Row]:
    return Counter(tuple(None if v is None else str(v) for v in row) for row in rows)


def source_rows(db: TestDatabase, query: str) -> Counter[Row]:
    return normalize(db.execute(query))


def copied_rows(batches: Iterable[pa.RecordBatch], schema: TableSchema) -> Counter[Row]:
    rows: list[tuple[Any, ...]] = []
    expected = pa.schema([arrow_field(c) for c in schema.columns])
    for batch in batches:
        assert batch.schema.names == expected.names
        assert batch.schema.types == expected.types
        assert batch.schema == expected
        rows.extend(zip(*(column.to_pylist() for column in batch.columns), strict=True))
    return normalize(rows)


def published(db: TestDatabase, table: str, publication: str = "pub") -> tuple[PublishedTable, TableSchema]:
    with connect(db.connection()) as conn:
        (entry,) = [t for t in publication_tables(conn, publication) if t.name.name == table]
        return entry, table_schema(conn, entry.id, entry.column_list)


def copy_range(  # noqa: PLR0917 - the order of the COPY's parts, as the tests name them
    config: PostgresConnection,
    schema: TableSchema,
    source: TableName,
    snapshot: str | None,
    ctid_range: CtidRange | None,
    row_filter: str | None,
    **options: Any,
) -> Iterator[pa.RecordBatch]:
    """One range of ``source``, copied as a copy plan's range is (``read_ranges``)."""
    return read_ranges(CopyPlan(config, snapshot, schema, (CopyRange(source, ctid_range),), row_filter), [0], **options)


def copy_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("copy-")]


def make_big_table(db: TestDatabase, rows: int = 4000) -> None:
    db.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
    db.execute(f"INSERT INTO big SELECT i, 'row ' || i || repeat('.', 150) FROM generate_series(1, {rows}) i")
    db.execute("CREATE PUBLICATION pub FOR TABLE big")


@pytest.mark.parametrize("rows", [0, 1])
def test_copy_empty_and_single_row_table(pg_database: TestDatabase, rows: int) -> None:
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg_database.execute(f"INSERT INTO t SELECT i, 'one' FROM generate_series(1, {rows}) i")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    table, schema = published(pg_database, "t")
    expected = source_rows(pg_database, "SELECT id, v FROM t")
    assert sum(expected.values()) == rows
    for connections in (1, 3):
        assert copied_rows(copy_table(pg_database.connection(), schema, table, None, connections), schema) == expected
    ranged = copy_range(pg_database.connection(), schema, table.name, None, None, None)
    assert copied_rows(ranged, schema) == expected


@pytest.mark.parametrize("connections", [1, 4])
def test_copy_many_pages(pg_database: TestDatabase, connections: int) -> None:
    make_big_table(pg_database)
    table, schema = published(pg_database, "big")
    pages = int(pg_database.execute("SELECT pg_relation_size('big') / current_setting('block_size')::int")[0][0])
    assert pages > 50
    with structlog.testing.capture_logs() as logs:
        batches = list(copy_table(pg_database.connection(), schema, table, None, connections, batch_rows=300))
    assert copied_rows(batches, schema) == source_rows(pg_database, "SELECT id, v FROM big")
    assert all(0 < b.num_rows <= 300 for b in batches)
    (started,) = [e for e in logs if e["event"] == "copying table"]
    assert started["connections"] == connections
    assert started["ranges"] == (1 if connections == 1 else 16)
    assert not copy_threads()


@pytest.mark.parametrize("connections", [2, 3])
def test_a_chunk_split_over_connections_reads_what_one_connection_reads(
    pg_database: TestDatabase, connections: int
) -> None:
    """An incremental copy's chunk read over several connections (key ranges in the first one's snapshot) holds
    the rows one connection reads, in key order: keys with gaps, a row filter, a backfill's predicate."""
    db = pg_database
    db.execute(
        "CREATE TABLE c (id bigint PRIMARY KEY, v text);"
        " INSERT INTO c SELECT g * 3, 'v' || g FROM generate_series(1, 20000) g;"
        " CREATE PUBLICATION pub FOR TABLE c WHERE (id % 2 = 0)"
    )
    table, schema = published(db, "c")
    first = KeyChunk(("id",), None, 5000)
    # the rows are ids 6, 12, 18, ...: every (5000 // connections)-th of them ends a part
    step = 5000 // connections
    bounds = [(str(6 * step * i),) for i in range(1, connections)]
    found = ChunkKeys.parse(db.execute(first.split_query(table.name, table.row_filter, step))[0][0])
    assert found == ChunkKeys(5000, (str(6 * 5000),), bounds)
    with db.connect(autocommit=True) as monitor:

        def sessions() -> int:
            """Sessions ever opened in the database, as the server's statistics count them (each backend counts
            itself as it exits)."""
            monitor.execute("SELECT pg_catalog.pg_stat_clear_snapshot()")
            row = monitor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
            return int(row.fetchone()[0])  # type: ignore[index]

        before = sessions()
        split = copy_chunk(db.connection(), schema, table.row_filter, first, connections=connections)[2]
        poll(
            lambda: sessions() - before,
            f"the chunk read over {connections} connections (sessions opened)",
            until=lambda opened: opened >= connections,
            timeout=10,
        )
    assert split.equals(copy_chunk(db.connection(), schema, table.row_filter, first)[2])
    later = (KeyChunk(("id",), ("21003",), 4500, where="v <> 'v9000'"), KeyChunk(("id",), ("57000",), 5000))
    for chunk in (first, *later):
        one = copy_chunk(db.connection(), schema, table.row_filter, chunk)[2]
        split = copy_chunk(db.connection(), schema, table.row_filter, chunk, connections=connections)[2]
        assert split.equals(one)
        # A backfill's chunk covers the table's first ``limit`` rows after ``after``; a copy's, ``limit`` rows it reads.
        after = chunk.after[0] if chunk.after else 0
        upto = f"(SELECT id FROM c WHERE id > {after} ORDER BY id OFFSET {chunk.limit - 1} LIMIT 1)"
        expected = db.execute(
            f"SELECT id, v FROM c WHERE id % 2 = 0 AND id > {after} AND {chunk.where or 'true'}"
            f" AND {'id <= ' + upto if chunk.where else 'true'} ORDER BY id LIMIT {chunk.limit}"
        )
        assert list(zip(*one.to_pydict().values(), strict=True)) == [tuple(r) for r in expected]


def test_a_backfill_chunk_covers_chunk_rows_of_the_table_whatever_its_predicate_picks(
    pg_database: TestDatabase,
) -> None:
    """A sparse predicate never makes one read scan the table (which could outlast the read timeout and be retried
    forever): each chunk covers the next ``limit`` rows by key, and the chunks walk the table to its end."""
    db = pg_database
    db.execute(
        "CREATE TABLE c (id bigint PRIMARY KEY, v text);"
        " INSERT INTO c SELECT g * 3, 'v' || g FROM generate_series(1, 20000) g;"
        " CREATE PUBLICATION pub FOR TABLE c"
    )
    _, schema = published(db, "c")
    chunk, found, reads = KeyChunk(("id",), None, 1000, where="v = 'v19999' OR v = 'v20000'"), [], 0
    while True:
        _, _, rows, keys, read = copy_chunk(db.connection(), schema, None, chunk)
        reads += 1
        found += rows.column("id").to_pylist()
        after = int(chunk.after[0]) if chunk.after else 0
        assert read.upto is None or int(read.upto[0]) - after == 3 * 1000  # 1000 rows of the table
        if read.ends_copy(rows.num_rows):
            break
        chunk = KeyChunk(("id",), read.reach(keys.last), 1000, chunk.where)
    assert found == [59_997, 60_000] and reads == 20


def test_copy_range_batches_and_ranges(pg_database: TestDatabase) -> None:
    make_big_table(pg_database, 1000)
    table, schema = published(pg_database, "big")
    batches = list(copy_range(pg_database.connection(), schema, table.name, None, None, None, batch_rows=100))
    assert [b.num_rows for b in batches] == [100] * 10
    with connect(pg_database.connection()) as conn:
        ranges = ctid_ranges(conn, table.name, 3)
    per_range = [
        copied_rows(copy_range(pg_database.connection(), schema, table.name, None, r, None), schema) for r in ranges
    ]
    assert all(per_range)
    assert sum(per_range, Counter()) == source_rows(pg_database, "SELECT id, v FROM big")


def test_copy_partitioned_table_from_its_leaves(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE p (id int, k int, v text, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)")
    pg_database.execute("CREATE TABLE p_low PARTITION OF p FOR VALUES FROM (0) TO (10)")
    pg_database.execute("CREATE TABLE p_high PARTITION OF p FOR VALUES FROM (10) TO (20) PARTITION BY RANGE (k)")
    pg_database.execute("CREATE TABLE p_high_a PARTITION OF p_high FOR VALUES FROM (10) TO (15)")
    pg_database.execute("CREATE TABLE p_high_b PARTITION OF p_high FOR VALUES FROM (15) TO (20)")
    pg_database.execute("INSERT INTO p SELECT i, i % 20, 'v' || i FROM generate_series(1, 2000) i")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE p WITH (publish_via_partition_root = true)")
    table, schema = published(pg_database, "p")
    assert table.partitioned and len(table.leaves) == 3
    expected = source_rows(pg_database, "SELECT id, k, v FROM p")
    for connections in (1, 2):
        assert copied_rows(copy_table(pg_database.connection(), schema, table, None, connections), schema) == expected


def test_copy_skips_inheritance_children(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE parent (id int)")
    pg_database.execute("CREATE TABLE child () INHERITS (parent)")
    pg_database.execute("INSERT INTO parent VALUES (1)")
    pg_database.execute("INSERT INTO child VALUES (2)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE parent")  # publishes the child as its own table
    parent, schema = published(pg_database, "parent")
    child, child_schema = published(pg_database, "child")
    assert copied_rows(copy_table(pg_database.connection(), schema, parent, None, 1), schema) == normalize([(1,)])
    assert copied_rows(copy_table(pg_database.connection(), child_schema, child, None, 1), schema) == normalize([(2,)])


def test_copy_row_filter_and_column_list(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, v text, secret text)")
    pg_database.execute("INSERT INTO t SELECT i, 'v' || i, 'hidden' FROM generate_series(1, 3000) i")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t (id, v) WHERE (id % 3 = 0 AND v <> 'v9')")
    table, schema = published(pg_database, "t")
    assert schema.column_names == ["id", "v"] and table.row_filter is not None
    expected = source_rows(pg_database, "SELECT id, v FROM t WHERE id % 3 = 0 AND id <> 9")
    assert sum(expected.values()) == 999
    for connections in (1, 3):
        assert copied_rows(copy_table(pg_database.connection(), schema, table, None, connections), schema) == expected


TRICKY = [
    (1, "plain"),
    (2, ""),
    (3, None),
    (4, 'comma, and "quotes"'),
    (5, "line one\nline two\r\nline three"),
    (6, "back\\slash \\N \\."),
    (7, '""'),
    (8, "  spaces  "),
    (9, "ünïcödé ✓ 日本"),
    (10, "\t"),
    (11, "NULL"),
]


def test_copy_keeps_text_exactly(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, v text, w text)")
    pg_database.execute("CREATE TABLE one (v text)")  # a NULL row is an empty CSV line here
    with pg_database.connect() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s, %s)", [(i, v, v) for i, v in TRICKY])
        cur.executemany("INSERT INTO one VALUES (%s)", [(v,) for _, v in TRICKY])
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t, one")
    table, schema = published(pg_database, "t")
    batches = list(copy_table(pg_database.connection(), schema, table, None, 1))
    got = {
        row[0]: row[1:] for row in zip(*(c.to_pylist() for c in pa.Table.from_batches(batches).columns), strict=True)
    }
    assert {int(k): v for k, v in got.items()} == {i: (v, v) for i, v in TRICKY}
    one, one_schema = published(pg_database, "one")
    values = pa.Table.from_batches(list(copy_table(pg_database.connection(), one_schema, one, None, 1))).column(0)
    assert Counter(values.to_pylist()) == Counter(v for _, v in TRICKY)


@dataclass(frozen=True)
class Exported:
    """The ``big`` table, its rows as of an exported snapshot, and the snapshot; rows changed after it."""

    table: PublishedTable
    schema: TableSchema
    rows: Counter[Row]
    snapshot: str


@pytest.fixture
def exported(pg_database: TestDatabase) -> Iterator[Exported]:
    make_big_table(pg_database, 2000)
    table, schema = published(pg_database, "big")
    expected = source_rows(pg_database, "SELECT id, v FROM big")
    with ReplicationConnection.connect(pg_database.connection()) as repl:
        slot = repl.create_slot("copy_slot", snapshot="export")
        assert slot.snapshot_name is not None
        pg_database.execute("INSERT INTO big SELECT i, 'late' FROM generate_series(5001, 6000) i")
        pg_database.execute("DELETE FROM big WHERE id <= 100")
        pg_database.execute("UPDATE big SET v = 'changed' WHERE id BETWEEN 200 AND 300")
        yield Exported(table, schema, expected, slot.snapshot_name)
        repl.drop_slot("copy_slot")


def test_copy_sees_the_exported_snapshot(pg_database: TestDatabase, exported: Exported) -> None:
    table, schema = exported.table, exported.schema
    for connections in (1, 3):
        batches = copy_table(pg_database.connection(), schema, table, exported.snapshot, connections)
        assert copied_rows(batches, schema) == exported.rows
    ranged = copy_range(pg_database.connection(), schema, table.name, exported.snapshot, None, None)
    assert copied_rows(ranged, schema) == exported.rows


def test_a_plans_ranges_copy_on_one_connection_in_its_snapshot(pg_database: TestDatabase, exported: Exported) -> None:
    """``read_ranges`` copies several ranges of a plan, as of its snapshot, on one backend."""
    plan = plan_copy(pg_database.connection(), exported.schema, exported.table, exported.snapshot, 4)
    assert len(plan.ranges) == 4
    backends: set[int] = set()
    rows: Counter[Row] = Counter()
    for batch in read_ranges(plan, [3, 1, 0, 2], batch_rows=100):
        backends |= {
            pid
            for (pid,) in pg_database.execute(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'COPY%' AND pid <> pg_backend_pid()"
            )
        }
        rows += copied_rows([batch], exported.schema)
    assert rows == exported.rows
    assert len(backends) == 1
    assert copied_rows(read_ranges(plan, [2]), exported.schema) != Counter()


def test_invalid_snapshot_is_a_clear_error(pg_database: TestDatabase) -> None:
    make_big_table(pg_database, 10)
    table, schema = published(pg_database, "big")
    with pytest.raises(SourceError) as info:
        list(copy_table(pg_database.connection(), schema, table, "00000003-0000001B-1", 2))
    assert "00000003-0000001B-1" in str(info.value) and info.value.hint
    assert not copy_threads()


def test_worker_error_stops_the_copy(pg_database: TestDatabase) -> None:
    make_big_table(pg_database)
    table, schema = published(pg_database, "big")
    failing = PublishedTable(table.id, table.name, "1 / (id - 3900) <> 7", None, False, ())  # fails on id 3900
    started = time.monotonic()
    with pytest.raises(TableError) as info:
        list(copy_table(pg_database.connection(), schema, failing, None, 4, batch_rows=50))
    assert "division by zero" in str(info.value)
    assert time.monotonic() - started < 30
    assert not copy_threads()
    wait_idle(pg_database)


def test_closing_early_stops_the_workers(pg_database: TestDatabase) -> None:
    make_big_table(pg_database)
    table, schema = published(pg_database, "big")
    batches = copy_table(pg_database.connection(), schema, table, None, 4, batch_rows=10)
    first = next(batches)
    assert first.num_rows == 10
    batches.close()
    assert not copy_threads()
    wait_idle(pg_database)


def test_table_without_columns_is_an_error(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t ()")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t")
    table, schema = published(pg_database, "t")
    with pytest.raises(TableError):
        list(copy_table(pg_database.connection(), schema, table, None, 2))
    with pytest.raises(TableError):
        list(copy_range(pg_database.connection(), schema, TableName("public", "t"), None, CtidRange(None, None), None))


def wait_idle(db: TestDatabase) -> None:
    """No copy connection stays open."""
    query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'COPY%%'"
    poll(lambda: int(db.execute(query)[0][0]), "no copy connection open", until=lambda n: n == 0, timeout=10)
