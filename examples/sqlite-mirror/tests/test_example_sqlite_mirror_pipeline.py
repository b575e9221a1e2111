"""The sqlite_mirror destination in real pipelines: a real Postgres, the plugins found by entry point.

Every check compares the mirror, read back with ``MirrorReader``, with the source table as psycopg
reads it (``etl.testing.compare.source_rows``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from etl.config import PipelineConfig
from etl.destination.base import Destination, WriteResult
from etl.errors import DestinationError, TransientError
from etl.events import EventBatch
from etl.factory import build_destination, build_store
from etl.pipeline import Pipeline
from etl.store.base import TableStateKind
from etl.testing.compare import source_rows
from etl.testing.pipelines import all_ready, pipeline_config, table_states, wait_until
from etl.testing.pytest_plugin import TestDatabase

from etl_plugin_example import MirrorReader, SqliteMirrorDestination

TABLES = ("public.accounts", "public.keyless")


@pytest.fixture
def source(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        """
        CREATE TABLE accounts (id int PRIMARY KEY, name text NOT NULL, balance numeric(12,2), tags text[],
                               doc text);
        ALTER TABLE accounts ALTER COLUMN doc SET STORAGE EXTERNAL;  -- large values go to TOAST uncompressed
        CREATE TABLE keyless (a int, b text);
        ALTER TABLE keyless REPLICA IDENTITY FULL;
        INSERT INTO accounts SELECT g, 'acct ' || g, g * 1.5, ARRAY['t' || g % 3], NULL FROM generate_series(1, 300) g;
        UPDATE accounts SET doc = repeat('large value ', 1000) WHERE id <= 3;
        INSERT INTO keyless SELECT g % 5, 'dup' FROM generate_series(1, 20) g;
        CREATE PUBLICATION pub FOR TABLE accounts, keyless;
        """
    )
    return pg_database


@pytest.fixture
def config(source: TestDatabase, tmp_path: Path) -> PipelineConfig:
    """Both plugins chosen by name, as in a pipeline file."""
    return pipeline_config(
        source,
        store={"type": "json_file", "path": str(tmp_path / "state.json")},
        destination={"type": "sqlite_mirror", "path": str(tmp_path / "mirror.db")},
    )


@pytest.fixture
def mirror_path(tmp_path: Path) -> Path:
    return tmp_path / "mirror.db"


def run(config: PipelineConfig, destination: Destination | None = None) -> Pipeline:
    store = build_store(config, "test")
    pipeline = Pipeline(config, store, destination or build_destination(config, store, "test"))
    pipeline.start()
    return pipeline


@pytest.fixture
def pipeline(config: PipelineConfig) -> Iterator[Pipeline]:
    running = run(config)
    yield running
    running.shutdown()


def mirrored(db: TestDatabase, path: Path, *tables: str) -> bool:
    """True when every named table holds the same rows in the mirror as in the source."""
    if not path.exists():
        return False
    with db.connect() as conn, MirrorReader(path) as mirror:
        for table in tables:
            try:
                if mirror.rows(table) != source_rows(conn, table):
                    return False
            except KeyError:
                return False
    return True


def wait_mirrored(db: TestDatabase, path: Path, pipeline: Pipeline, *tables: str, what: str) -> None:
    wait_until(lambda: mirrored(db, path, *tables), what, pipeline)


CHANGES = (
    """
    BEGIN;
    INSERT INTO accounts VALUES (1001, 'new', 10.00, '{}', NULL), (1002, 'new2', NULL, NULL, 'small');
    UPDATE accounts SET balance = balance + 1 WHERE id % 10 = 0;
    UPDATE accounts SET id = 2000 WHERE id = 5;
    DELETE FROM accounts WHERE id BETWEEN 100 AND 120;
    COMMIT;
    """,
    "UPDATE accounts SET name = 'toast kept' WHERE id <= 3",  # doc is unchanged TOAST: not sent
    "UPDATE accounts SET id = id + 5000 WHERE id = 2",  # key change of a row with unchanged TOAST
    "DELETE FROM keyless WHERE ctid IN (SELECT ctid FROM keyless WHERE a = 1 LIMIT 1)",
    "UPDATE keyless SET b = 'changed' WHERE a = 2",
    "INSERT INTO keyless VALUES (9, NULL), (9, NULL)",
)


def test_copy_and_stream_mirror_the_source(source: TestDatabase, pipeline: Pipeline, mirror_path: Path) -> None:
    wait_until(lambda: all_ready(pipeline, 2), "both tables ready", pipeline)
    assert mirrored(source, mirror_path, *TABLES)

    for sql in CHANGES:
        source.execute(sql)
    wait_mirrored(source, mirror_path, pipeline, *TABLES, what="streamed changes")
    with MirrorReader(mirror_path) as mirror:
        docs = {r["id"]: r["doc"] for r in mirror.rows("accounts") if r["doc"] is not None}
        assert docs[1] == docs[5002] == "large value " * 1000  # kept through updates that did not send it
        assert sum(1 for r in mirror.rows("keyless") if r["a"] == 1) == 3  # one of four duplicates deleted
        watermark = mirror.watermark("accounts")
        assert watermark is not None and watermark[0] > 0

    source.execute("TRUNCATE accounts, keyless")
    source.execute("INSERT INTO keyless VALUES (1, 'after truncate')")
    wait_mirrored(source, mirror_path, pipeline, *TABLES, what="truncate")
    with MirrorReader(mirror_path) as mirror:
        assert mirror.rows("accounts") == []


class ReplayingMirror(SqliteMirrorDestination):
    """Writes every batch twice, the second time as a replay after a restart would."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.replayed_rows = 0

    def write_events(self, batch: EventBatch) -> WriteResult:
        super().write_events(batch)
        self.replayed_rows += batch.row_count()
        return super().write_events(batch)


def test_replayed_batches_change_nothing(source: TestDatabase, config: PipelineConfig, mirror_path: Path) -> None:
    destination = ReplayingMirror(mirror_path)
    pipeline = run(config, destination)
    try:
        wait_until(lambda: all_ready(pipeline, 2), "both tables ready", pipeline)
        for sql in CHANGES:
            source.execute(sql)
        # Inserts into the key-less table would be doubled, and its deletes would remove two rows, if
        # the replays were applied again.
        wait_mirrored(source, mirror_path, pipeline, *TABLES, what="changes applied once")
    finally:
        pipeline.shutdown()  # drains the write in flight, so every replay is done
    assert destination.replayed_rows > 0
    assert mirrored(source, mirror_path, *TABLES)


class FailingAfterCommit(SqliteMirrorDestination):
    """Commits the first batch of changes, then fails as a lost connection would: the engine writes it again."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failed: EventBatch | None = None
        self.rewritten = threading.Event()

    def write_events(self, batch: EventBatch) -> WriteResult:
        result = super().write_events(batch)
        if batch is self.failed:
            self.rewritten.set()
        elif self.failed is None and batch.row_count():
            self.failed = batch
            raise TransientError("simulated: the connection was lost before the commit was acknowledged")
        return result


def test_engine_retry_after_a_committed_write_is_skipped(
    source: TestDatabase, config: PipelineConfig, mirror_path: Path
) -> None:
    destination = FailingAfterCommit(mirror_path)
    pipeline = run(config, destination)
    try:
        wait_until(lambda: all_ready(pipeline, 2), "both tables ready", pipeline)
        source.execute("BEGIN; INSERT INTO keyless VALUES (7, 'once'); DELETE FROM accounts WHERE id = 10; COMMIT;")
        wait_until(destination.rewritten.is_set, "the engine writing the failed batch again", pipeline)
        assert mirrored(source, mirror_path, *TABLES)
        with MirrorReader(mirror_path) as mirror:
            assert [r for r in mirror.rows("keyless") if r["a"] == 7] == [{"a": 7, "b": "once"}]
    finally:
        pipeline.shutdown()


def test_restart_resumes_without_copying_again(source: TestDatabase, config: PipelineConfig, mirror_path: Path) -> None:
    first = run(config)
    try:
        wait_until(lambda: all_ready(first, 2), "both tables ready", first)
        source.execute("INSERT INTO keyless VALUES (8, 'before restart')")
        wait_mirrored(source, mirror_path, first, *TABLES, what="a change before the restart")
    finally:
        first.shutdown()
    source.execute("INSERT INTO keyless VALUES (8, 'while stopped'); DELETE FROM accounts WHERE id < 50")

    class CountingCopies(SqliteMirrorDestination):
        copies = 0

        def write_table_rows(self, schema: Any, rows: Any) -> WriteResult:
            CountingCopies.copies += 1
            return super().write_table_rows(schema, rows)

    second = run(config, CountingCopies(mirror_path))  # the json_file store remembers the tables and progress
    try:
        wait_mirrored(source, mirror_path, second, *TABLES, what="changes made while stopped")
        assert CountingCopies.copies == 0
    finally:
        second.shutdown()


@pytest.mark.parametrize("trigger", [True, False], ids=["ddl-trigger", "relation-only"])
def test_schema_changes_alter_the_mirror(
    source: TestDatabase, tmp_path: Path, mirror_path: Path, trigger: bool
) -> None:
    # Without the DDL trigger, a schema change reaches the stream only with the table's next row, and
    # added columns have no attribute number: the last rename is matched as the engine inferred it
    # (``etl.schema.match_columns``).
    config = pipeline_config(
        source,
        pipeline={"install_ddl_trigger": trigger},
        store={"type": "json_file", "path": str(tmp_path / "state.json")},
        destination={"type": "sqlite_mirror", "path": str(mirror_path)},
    )
    pipeline = run(config)
    try:
        wait_until(lambda: all_ready(pipeline, 2), "both tables ready", pipeline)
        for sql in (
            "ALTER TABLE accounts RENAME COLUMN name TO title",
            "UPDATE accounts SET title = 'renamed' WHERE id = 1",
            "ALTER TABLE accounts ADD COLUMN rating int",
            "UPDATE accounts SET rating = id % 7 WHERE id <= 20",
            "ALTER TABLE accounts DROP COLUMN tags",
            "UPDATE accounts SET rating = 0 WHERE id = 2",
            "ALTER TABLE accounts RENAME COLUMN rating TO stars",
            "INSERT INTO accounts (id, title, stars) VALUES (3000, 'after changes', 1)",
            "ALTER TABLE keyless RENAME TO not_keyless",
            "INSERT INTO not_keyless VALUES (42, 'renamed table')",
        ):
            source.execute(sql)
        wait_mirrored(source, mirror_path, pipeline, "public.accounts", "public.not_keyless", what="schema changes")
        with MirrorReader(mirror_path) as mirror:
            assert mirror.schema("accounts").column_names == ["id", "title", "balance", "doc", "stars"]
            assert [str(name) for name in mirror.tables()] == ["public.accounts", "public.not_keyless"]
    finally:
        pipeline.shutdown()


def test_a_type_change_fails_only_that_table(source: TestDatabase, pipeline: Pipeline, mirror_path: Path) -> None:
    wait_until(lambda: all_ready(pipeline, 2), "both tables ready", pipeline)
    source.execute("ALTER TABLE keyless ALTER COLUMN a TYPE text")
    source.execute("INSERT INTO keyless VALUES ('x', 'after type change')")
    wait_until(lambda: table_states(pipeline).get(_oid(source, "keyless")) is TableStateKind.ERRORED, "keyless errored")
    source.execute("INSERT INTO accounts VALUES (4000, 'still streaming', 1, NULL, NULL)")
    wait_mirrored(source, mirror_path, pipeline, "public.accounts", what="the other table")


def _oid(db: TestDatabase, table: str) -> int:
    return int(db.execute("SELECT %s::regclass::oid", (table,))[0][0])


TYPES = """
    CREATE TABLE types (
        id int PRIMARY KEY, b bool, i2 int2, i8 int8, o oid, f4 real, f8 double precision, n numeric(10,2),
        nu numeric, t text, vc varchar(10), ch char(4), by bytea, d date, ts timestamp, tz timestamptz,
        tm time, iv interval, u uuid, j json, jb jsonb, ip inet, m money,
        ai int[], at text[], an numeric(6,2)[], af real[], ab bytea[], ad date[], aii int[][]
    );
    CREATE PUBLICATION types_pub FOR TABLE types;
"""
TYPE_ROW = """
    INSERT INTO types VALUES ({id}, true, -32768, 9223372036854775807, 4294967295, 1.1, -2.5e-300, -12345678.90,
        '123456789012345678901234567890.000000001', 'tëxt "q"', 'short', 'ab', '\\x00ff10', '2024-02-29',
        '2024-02-29 12:34:56.789012', '2024-02-29 12:34:56.789012+05:30', '23:59:59.999999',
        '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{{"a": [1, 2]}}',
        '{{"b": null, "a": 1}}', '192.168.0.1/24', 12.34, '{{1,NULL,3}}', '{{"a \\"b\\"",NULL,"NULL",""}}',
        '{{1.50,NULL}}', '{{1.1,-0}}', '{{"\\\\x00ff",NULL}}', '{{2024-01-01,NULL}}', '{{{{1,2}},{{3,NULL}}}}'
    ), ({id} + 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '{{}}')
"""


def test_values_read_back_as_psycopg_reads_the_source(pg_database: TestDatabase, tmp_path: Path) -> None:
    pg_database.execute(TYPES)
    pg_database.execute(TYPE_ROW.format(id=1))  # copied
    config = pipeline_config(
        pg_database, "types_pub", destination={"type": "sqlite_mirror", "path": str(tmp_path / "mirror.db")}
    )
    pipeline = run(config)
    try:
        wait_until(lambda: all_ready(pipeline, 1), "types ready", pipeline)
        pg_database.execute(TYPE_ROW.format(id=10))  # streamed
        wait_until(lambda: _row_count(tmp_path / "mirror.db") == 4, "streamed rows", pipeline)
        with pg_database.connect() as conn, MirrorReader(tmp_path / "mirror.db") as mirror:
            assert mirror.rows("types") == source_rows(conn, "public.types")

        # Values psycopg cannot load (infinite dates) or compare (NaN): checked one by one.
        pg_database.execute(
            "INSERT INTO types (id, f4, f8, d, ts) VALUES (20, 'NaN', '-Infinity', 'infinity', '-infinity')"
        )
        wait_until(lambda: _row_count(tmp_path / "mirror.db") == 5, "the special values", pipeline)
        with MirrorReader(tmp_path / "mirror.db") as mirror:
            special = next(row for row in mirror.rows("types") if row["id"] == 20)
        assert math.isnan(special["f4"]) and special["f8"] == -math.inf
        assert (special["d"], special["ts"]) == ("infinity", "-infinity")
    finally:
        pipeline.shutdown()


def _row_count(path: Path) -> int:
    try:
        with MirrorReader(path) as mirror:
            return len(mirror.rows("types"))
    except (KeyError, DestinationError):
        return 0
