"""Catalog reads against a real Postgres: publications, table schemas, replica identity, ctid planning."""

from __future__ import annotations

import itertools

import pytest
import structlog
import structlog.testing

from etl.errors import SourceError, TableError
from etl.postgres.catalog import (
    CtidRange,
    ctid_ranges,
    publication_exists,
    publication_options,
    publication_tables,
    table_bytes,
    table_schema,
)
from etl.postgres.connection import connect
from etl.postgres.ddl import install_ddl_trigger
from etl.schema import ReplicaIdentity, TableName
from etl.testing.pytest_plugin import TestDatabase


def oid(db: TestDatabase, table: str) -> int:
    return int(db.execute("SELECT %s::regclass::oid::int", (table,))[0][0])


def setup_partitions(db: TestDatabase) -> None:
    db.execute("CREATE TABLE p (id int, k int, PRIMARY KEY (id, k)) PARTITION BY RANGE (k)")
    db.execute("CREATE TABLE p_b PARTITION OF p FOR VALUES FROM (0) TO (10)")
    db.execute("CREATE TABLE p_a PARTITION OF p FOR VALUES FROM (10) TO (20) PARTITION BY RANGE (k)")
    db.execute("CREATE TABLE p_a1 PARTITION OF p_a FOR VALUES FROM (10) TO (15)")
    db.execute("CREATE TABLE p_a2 PARTITION OF p_a FOR VALUES FROM (15) TO (20)")


# -- publications ---------------------------------------------------------------------------------------


def test_missing_publication(pg_database: TestDatabase) -> None:
    with connect(pg_database.connection()) as conn:
        assert publication_exists(conn, "nope") is False
        for read in (publication_tables, publication_options):
            with pytest.raises(SourceError) as info:
                read(conn, "nope")
            assert "nope" in str(info.value)
            assert info.value.hint is not None and 'CREATE PUBLICATION "nope"' in info.value.hint


def test_publication_for_listed_tables(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE b (id int primary key)")
    pg_database.execute("CREATE TABLE a (id int primary key)")
    pg_database.execute("CREATE TABLE unpublished (id int)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE b, a WITH (publish = 'insert, update')")
    with connect(pg_database.connection()) as conn:
        assert publication_exists(conn, "pub")
        tables = publication_tables(conn, "pub")
        options = publication_options(conn, "pub")
    assert [t.name for t in tables] == [TableName("public", "a"), TableName("public", "b")]
    assert [t.id for t in tables] == [oid(pg_database, "a"), oid(pg_database, "b")]
    for table in tables:
        assert (table.row_filter, table.column_list, table.partitioned, table.leaves) == (None, None, False, ())
        assert table.sources == (table.name,)
    assert (options.inserts, options.updates, options.deletes, options.truncates) == (True, True, False, False)
    assert not options.all_tables and not options.via_root and not options.generated_columns


def test_publication_for_all_tables_and_schemas(pg_database: TestDatabase) -> None:
    """Schemas and FOR ALL TABLES are expanded, without the pipeline's own tables (the trigger's record, a store's):
    they are left out, and said so once."""
    pg_database.execute("CREATE SCHEMA s")
    pg_database.execute('CREATE TABLE s."Mixed Case" (id int)')
    pg_database.execute("CREATE TABLE public.t (id int)")
    with connect(pg_database.connection()) as conn:
        assert install_ddl_trigger(conn)
    pg_database.execute("CREATE TABLE etl.etl_progress (id int)")  # as the Postgres store makes in the source
    pg_database.execute("CREATE PUBLICATION everything FOR ALL TABLES")
    pg_database.execute("CREATE PUBLICATION one_schema FOR TABLES IN SCHEMA s")
    pg_database.execute("CREATE PUBLICATION own FOR TABLES IN SCHEMA etl")
    with connect(pg_database.connection()) as conn, structlog.testing.capture_logs() as logs:
        everything = publication_tables(conn, "everything")
        assert publication_tables(conn, "everything") == everything
        one_schema = publication_tables(conn, "one_schema")
        assert publication_tables(conn, "own") == []
        assert publication_options(conn, "everything").all_tables
    assert [t.name for t in everything] == [TableName("public", "t"), TableName("s", "Mixed Case")]
    assert [t.name for t in one_schema] == [TableName("s", "Mixed Case")]
    left_out = [e for e in logs if e["event"] == "the pipeline's own tables are left out of the publication's tables"]
    assert [(e["publication"], e["tables"]) for e in left_out] == [
        (pub, ["etl.etl_progress", "etl.schema_change_messages"]) for pub in ("everything", "own")
    ]


def test_partitioned_table_via_root(pg_database: TestDatabase) -> None:
    setup_partitions(pg_database)
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE p WITH (publish_via_partition_root = true)")
    with connect(pg_database.connection()) as conn:
        (table,) = publication_tables(conn, "pub")
        assert publication_options(conn, "pub").via_root
    assert table.id == oid(pg_database, "p") and table.partitioned
    assert table.leaves == (TableName("public", "p_a1"), TableName("public", "p_a2"), TableName("public", "p_b"))
    assert table.sources == table.leaves


def test_partitioned_table_without_via_root_publishes_leaves(pg_database: TestDatabase) -> None:
    setup_partitions(pg_database)
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE p")
    with connect(pg_database.connection()) as conn:
        tables = publication_tables(conn, "pub")
    assert [t.name.name for t in tables] == ["p_a1", "p_a2", "p_b"]
    assert not any(t.partitioned for t in tables)
    assert [t.id for t in tables] == [oid(pg_database, n) for n in ("p_a1", "p_a2", "p_b")]


def test_row_filter_and_column_list(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int primary key, x int, secret text)")
    pg_database.execute("CREATE TABLE plain (id int)")
    pg_database.execute("CREATE PUBLICATION pub FOR TABLE t (id, x) WHERE (x > 1 AND id <> 7), plain")
    setup_partitions(pg_database)
    pg_database.execute(
        "CREATE PUBLICATION proot FOR TABLE p (id, k) WHERE (k > 2) WITH (publish_via_partition_root = true)"
    )
    with connect(pg_database.connection()) as conn:
        plain, t = publication_tables(conn, "pub")
        (p,) = publication_tables(conn, "proot")
    assert t.column_list == ("id", "x")
    assert t.row_filter is not None and "x > 1" in t.row_filter and "id <> 7" in t.row_filter
    assert (plain.column_list, plain.row_filter) == (None, None)
    assert p.column_list == ("id", "k") and p.row_filter == "(k > 2)"
    # the filter is valid SQL against the table
    pg_database.execute(f"SELECT count(*) FROM t WHERE {t.row_filter}")


# -- table schemas --------------------------------------------------------------------------------------


def test_table_schema_columns(pg_database: TestDatabase) -> None:
    pg_database.execute(
        "CREATE TABLE t (id bigint primary key, dropped int, name varchar(10) NOT NULL, amount numeric(10, 2),"
        " g int GENERATED ALWAYS AS (id * 2) STORED, tags text[])"
    )
    pg_database.execute("ALTER TABLE t DROP COLUMN dropped")
    with connect(pg_database.connection()) as conn, structlog.testing.capture_logs() as logs:
        schema = table_schema(conn, oid(pg_database, "t"))
        with_generated = table_schema(conn, oid(pg_database, "t"), include_generated=True)
    assert schema.id == oid(pg_database, "t") and schema.name == TableName("public", "t")
    assert schema.replica_identity is ReplicaIdentity.DEFAULT
    assert [(c.name, c.type_oid, c.type_modifier, c.type_name, c.nullable, c.primary_key) for c in schema.columns] == [
        ("id", 20, -1, "bigint", False, True),
        ("name", 1043, 14, "character varying(10)", False, False),
        ("amount", 1700, (10 << 16 | 2) + 4, "numeric(10,2)", True, False),
        ("tags", 1009, -1, "text[]", True, False),
    ]
    assert [e for e in logs if e["event"] == "generated columns are not replicated"] == [
        {"event": "generated columns are not replicated", "log_level": "warning", "table": "public.t", "columns": ["g"]}
    ]
    assert with_generated.column_names == ["id", "name", "amount", "g", "tags"]


def test_table_schema_column_list(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int primary key, a int, b int, c int)")
    with connect(pg_database.connection()) as conn:
        schema = table_schema(conn, oid(pg_database, "t"), ["c", "id"])
        assert schema.column_names == ["id", "c"]
        with pytest.raises(TableError) as info:
            table_schema(conn, oid(pg_database, "t"), ["id", "nope"])
        assert "nope" in str(info.value)


@pytest.mark.parametrize(
    ("identity", "expected", "key"),
    [
        ("DEFAULT", ReplicaIdentity.DEFAULT, ["a", "b"]),
        ("FULL", ReplicaIdentity.FULL, ["a", "b"]),
        ("NOTHING", ReplicaIdentity.NOTHING, ["a", "b"]),
        ("USING INDEX t_c_key", ReplicaIdentity.INDEX, ["c"]),
    ],
)
def test_table_schema_replica_identity(
    pg_database: TestDatabase, identity: str, expected: ReplicaIdentity, key: list[str]
) -> None:
    pg_database.execute("CREATE TABLE t (a int, b int, c int NOT NULL UNIQUE, d int, PRIMARY KEY (b, a))")
    pg_database.execute(f"ALTER TABLE t REPLICA IDENTITY {identity}")
    with connect(pg_database.connection()) as conn:
        schema = table_schema(conn, oid(pg_database, "t"))
    assert schema.replica_identity is expected
    assert [c.name for c in schema.key_columns] == key


def test_table_schema_full_identity_without_primary_key(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (a int, b int)")
    pg_database.execute("ALTER TABLE t REPLICA IDENTITY FULL")
    with connect(pg_database.connection()) as conn:
        schema = table_schema(conn, oid(pg_database, "t"))
    assert schema.replica_identity is ReplicaIdentity.FULL and schema.key_columns == []


def test_table_schema_of_partitioned_root(pg_database: TestDatabase) -> None:
    setup_partitions(pg_database)
    with connect(pg_database.connection()) as conn:
        schema = table_schema(conn, oid(pg_database, "p"))
    assert schema.column_names == ["id", "k"] and [c.name for c in schema.key_columns] == ["id", "k"]


def test_table_schema_of_missing_table(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int)")
    table_id = oid(pg_database, "t")
    pg_database.execute("DROP TABLE t")
    with connect(pg_database.connection()) as conn, pytest.raises(TableError) as info:
        table_schema(conn, table_id)
    assert str(table_id) in str(info.value) and info.value.hint


# -- ctid planning --------------------------------------------------------------------------------------


def count_in(db: TestDatabase, table: str, ranges: list[CtidRange]) -> list[int]:
    return [int(db.execute(f"SELECT count(*) FROM {table} WHERE {r.predicate() or 'true'}")[0][0]) for r in ranges]


def test_ctid_ranges_of_empty_table(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int)")
    with connect(pg_database.connection()) as conn:
        assert ctid_ranges(conn, TableName("public", "t"), 4) == [CtidRange(None, None)]
    assert CtidRange(None, None).predicate() is None


def test_ctid_ranges_cover_every_row_once(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int, pad text)")
    pg_database.execute("INSERT INTO t SELECT i, repeat('x', 200) FROM generate_series(1, 5000) i")
    pages = int(pg_database.execute("SELECT pg_relation_size('t') / current_setting('block_size')::int")[0][0])
    assert pages > 100
    with connect(pg_database.connection()) as conn:
        ranges = ctid_ranges(conn, TableName("public", "t"), 4)
        assert ctid_ranges(conn, TableName("public", "t"), 1) == [CtidRange(None, None)]
    assert len(ranges) == 4
    assert ranges[0].start_block is None and ranges[-1].end_block is None
    for left, right in itertools.pairwise(ranges):
        assert left.end_block == right.start_block and left.end_block is not None
    counts = count_in(pg_database, "t", ranges)
    assert sum(counts) == 5000 and min(counts) > 1000
    assert (
        ranges[1].predicate()
        == f"ctid >= '({ranges[1].start_block},0)'::tid AND ctid < '({ranges[1].end_block},0)'::tid"
    )
    plan = "\n".join(r[0] for r in pg_database.execute(f"EXPLAIN SELECT * FROM t WHERE {ranges[1].predicate()}"))
    assert "Tid Range Scan" in plan
    # rows on pages added after planning fall into the open last range
    pg_database.execute("INSERT INTO t SELECT i, repeat('y', 200) FROM generate_series(1, 1000) i")
    assert count_in(pg_database, "t", ranges)[:3] == counts[:3]
    assert sum(count_in(pg_database, "t", ranges)) == 6000


def test_ctid_ranges_never_exceed_pages(pg_database: TestDatabase) -> None:
    pg_database.execute("CREATE TABLE t (id int)")
    pg_database.execute("INSERT INTO t SELECT generate_series(1, 500)")  # 2-3 pages
    with connect(pg_database.connection()) as conn:
        ranges = ctid_ranges(conn, TableName("public", "t"), 64)
    pages = int(pg_database.execute("SELECT pg_relation_size('t') / current_setting('block_size')::int")[0][0])
    assert len(ranges) == pages
    assert sum(count_in(pg_database, "t", ranges)) == 500


def test_table_bytes_counts_long_values_and_every_leaf(pg_database: TestDatabase) -> None:
    """What a copy reads: the heap and the TOAST of long values, of each table asked for (leaves, say)."""
    pg_database.execute("CREATE TABLE t (id int, doc text); ALTER TABLE t ALTER doc SET STORAGE EXTERNAL")
    pg_database.execute("INSERT INTO t SELECT g, repeat(md5(g::text), 2000) FROM generate_series(1, 100) g")
    heap = int(pg_database.execute("SELECT pg_relation_size('t')")[0][0])
    setup_partitions(pg_database)
    pg_database.execute("INSERT INTO p SELECT g, g % 20 FROM generate_series(1, 1000) g")
    with connect(pg_database.connection()) as conn:
        size = table_bytes(conn, [TableName("public", "t")])
        assert size > 100 * 64_000 > heap  # each value ~64 kB, out of line
        leaves = [TableName("public", name) for name in ("p_b", "p_a1", "p_a2")]
        assert table_bytes(conn, leaves) == sum(table_bytes(conn, [leaf]) for leaf in leaves) > 0
        assert table_bytes(conn, [*leaves, TableName("public", "t")]) == table_bytes(conn, leaves) + size


def test_ctid_ranges_errors(pg_database: TestDatabase) -> None:
    setup_partitions(pg_database)
    with connect(pg_database.connection()) as conn:
        with pytest.raises(TableError) as info:
            ctid_ranges(conn, TableName("public", "p"), 2)
        assert "leaf" in str(info.value)
        with pytest.raises(TableError):
            ctid_ranges(conn, TableName("public", "missing"), 2)
        with pytest.raises(ValueError):
            ctid_ranges(conn, TableName("public", "p_b"), 0)
