"""Chunks of any key: composite, collated text, uuid, enums, timestamps; walked in the order of the key's index, and
compared with the stream's keys by the source (``etl.postgres.key_order``), never in Python."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from etl.key_chunk import KeyChunk
from etl.postgres.catalog import publication_tables, table_schema
from etl.postgres.codecs import decode_text_column
from etl.postgres.connection import connect
from etl.postgres.copy import copy_chunk, plan_chunk, read_ranges
from etl.postgres.key_order import SourceComparisons, SourceKeyOrder, key_index_order
from etl.schema import TableSchema
from etl.testing.pytest_plugin import TestDatabase

TENANTS = ["a", "B", "b", "A", "é", "e", "ab", "Ab", "z", "ä"]
"""Under ICU's root collation (or en_US): a < A < ab < Ab < ä < b < B < e < é < z; bytewise: A < Ab < B < a < ab <
b < ..."""


def keyed_table(db: TestDatabase, rows: int) -> TableSchema:
    """``t``: a primary key of (tenant text under ``TestDatabase.text_collation``, id uuid), declared in that order
    but holding the columns the other way round, and a mood enum beside them."""
    db.execute(
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');"
        f" CREATE TABLE t (id uuid, v text, tenant text COLLATE {db.text_collation()}, m mood,"
        " PRIMARY KEY (tenant, id));"
        f" INSERT INTO t SELECT md5(g::text)::uuid, 'v' || g, (ARRAY{TENANTS!r})[1 + g % {len(TENANTS)}],"
        f" (ARRAY['sad', 'ok', 'happy'])[1 + g % 3]::mood FROM generate_series(1, {rows}) g;"
        " CREATE PUBLICATION pub FOR TABLE t"
    )
    with connect(db.connection()) as conn:
        (table,) = publication_tables(conn, "pub")
        return table_schema(conn, table.id, table.column_list)


def source_order(db: TestDatabase) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in db.execute("SELECT tenant, id::text FROM t ORDER BY tenant, id")]


def test_chunks_of_a_composite_collated_key_walk_the_index_in_the_sources_order(pg_database: TestDatabase) -> None:
    db = pg_database
    schema = keyed_table(db, 5000)
    with connect(db.connection()) as conn:
        key, _ = key_index_order(conn, schema.id, [c.name for c in schema.key_columns])
    assert key == ("tenant", "id")  # the index's order, not the columns'
    for connections in (1, 3):
        chunk, walked = KeyChunk(key, None, 1200), []
        while True:
            _, _, rows, keys, read = copy_chunk(db.connection(), schema, None, chunk, connections=connections)
            walked += list(zip(rows.column("tenant").to_pylist(), rows.column("id").to_pylist(), strict=True))
            assert keys.rows == rows.num_rows
            if read.ends_copy(rows.num_rows):
                break
            assert keys.last == (walked[-1][0], walked[-1][1])
            chunk = KeyChunk(key, read.reach(keys.last), 1200)
        assert [(t, str(i)) for t, i in walked] == source_order(db)


def test_a_planned_chunk_of_a_composite_key_reads_its_parts_in_order(pg_database: TestDatabase) -> None:
    db = pg_database
    schema = keyed_table(db, 5000)
    after = source_order(db)[999]
    with plan_chunk(db.connection(), schema, None, KeyChunk(("tenant", "id"), after, 3000), parts=3) as planned:
        _, _, keys, plan, _ = planned
        assert len(plan.ranges) == 3
        read = pa.Table.from_batches(list(read_ranges(plan, range(len(plan.ranges)))))
    got = list(zip(read.column("tenant").to_pylist(), map(str, read.column("id").to_pylist()), strict=True))
    assert got == source_order(db)[1000:4000] and keys.last == got[-1]


def test_a_backfill_chunk_of_a_composite_key_is_bounded_by_the_tables_rows(pg_database: TestDatabase) -> None:
    db = pg_database
    schema = keyed_table(db, 3000)
    chunk, found = KeyChunk(("tenant", "id"), None, 700, where="m = 'happy'"), []
    while True:
        _, _, rows, keys, read = copy_chunk(db.connection(), schema, None, chunk)
        found += [
            (t, str(i)) for t, i in zip(rows.column("tenant").to_pylist(), rows.column("id").to_pylist(), strict=True)
        ]
        if read.ends_copy(rows.num_rows):
            break
        chunk = KeyChunk(chunk.columns, read.reach(keys.last), 700, chunk.where)
    happy = [tuple(r) for r in db.execute("SELECT tenant, id::text FROM t WHERE m = 'happy' ORDER BY tenant, id")]
    assert found == happy


@pytest.mark.parametrize(
    ("ddl", "values", "bound"),
    [
        ("k text COLLATE {collation}", ["a", "B", "b", "A", "ä", "z", None], "b"),
        ("k mood", ["sad", "happy", "ok", None], "ok"),
        ("k numeric", ["1.5", "-2", "10", "NaN", "1.50"], "1.50"),
        ("k timestamptz", ["2026-01-01 00:00:00+00", "2025-01-01 10:00:00+00", "infinity", "-infinity"], "2025-06-01"),
        ("k date", ["2026-01-01", "0044-03-15 BC", "infinity"], "2025-06-01"),
        ("k bytea", ["\\x00", "\\xff", "\\x6127622573"], "\\x61"),
    ],
)
def test_the_source_compares_the_streams_keys_under_its_own_order(
    pg_database: TestDatabase, ddl: str, values: list[str | None], bound: str
) -> None:
    """What ``at_most`` says of each key, decoded as the stream decodes it, is what ``<=`` in the source says of
    it, under the column's collation; a null key is never copied."""
    db = pg_database
    ddl = ddl.format(collation=db.text_collation())
    db.execute(f"CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy'); CREATE TABLE k ({ddl} PRIMARY KEY)")
    with connect(db.connection()) as conn:
        table_id = int(conn.execute("SELECT 'public.k'::regclass::oid").fetchall()[0][0])
        (column,) = table_schema(conn, table_id, None).columns
    type_name = db.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'k'::regclass AND attname = 'k'"
    )[0][0]
    collate = f" COLLATE {db.text_collation()}" if "COLLATE" in ddl else ""
    comparisons = SourceComparisons(db.connection())
    try:
        order = SourceKeyOrder(comparisons, table_id, ("k",))
        got = order.at_most([decode_text_column(column, pa.array(values, pa.string()))], (bound,)).tolist()
        expected = [
            v is not None and db.execute(f"SELECT %s::{type_name}{collate} <= %s::{type_name}", [v, bound])[0][0]
            for v in values
        ]
        assert got == expected and any(got) and not all(got)
        assert order.not_after((bound,), (bound,)) and order.not_after((str(values[2]),), (bound,)) == expected[2]
    finally:
        comparisons.close()


def test_a_key_index_that_orders_otherwise_is_no_chunk_key(pg_database: TestDatabase) -> None:
    db = pg_database
    db.execute(
        "CREATE TABLE p (k text NOT NULL); CREATE UNIQUE INDEX p_k ON p (k text_pattern_ops);"
        " ALTER TABLE p REPLICA IDENTITY USING INDEX p_k;"
        ' CREATE TABLE c (k text NOT NULL); CREATE UNIQUE INDEX c_k ON c (k COLLATE "C");'
        " ALTER TABLE c REPLICA IDENTITY USING INDEX c_k;"
        " CREATE TABLE q (a int, b text, PRIMARY KEY (b, a)); CREATE TABLE n (a int)"
    )

    def key(table: str, columns: list[str] | None = None) -> tuple[tuple[str, ...] | None, str]:
        with connect(db.connection()) as conn:
            return key_index_order(conn, int(db.execute(f"SELECT '{table}'::regclass::oid")[0][0]), columns)

    own = "its key's index orders by an operator class or a collation of its own"
    assert key("p") == key("c") == (None, own)
    assert key("q") == key("q", ["a", "b"]) == (("b", "a"), "")
    assert key("q", ["a"]) == key("n") == (None, "it has no primary key or replica identity index")
