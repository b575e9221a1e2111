"""Behaviours users rely on, end to end on a real Postgres into the memory destination."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from etl.destination.base import WriteResult
from etl.destination.memory import MemoryDestination
from etl.events import EventBatch
from etl.pipeline import Pipeline
from etl.schema import TableName
from etl.store.base import TableStateKind
from etl.store.memory import MemoryStore
from etl.testing.compare import source_rows
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, table_states, wait_until
from etl.testing.pytest_plugin import TestDatabase

Start = Callable[..., tuple[Pipeline, MemoryDestination]]


@pytest.fixture
def start(pg_database: TestDatabase) -> Iterator[Start]:
    """Start a pipeline on the test database; every pipeline started is shut down after the test."""
    pipelines: list[Pipeline] = []

    def run(**sections: object) -> tuple[Pipeline, MemoryDestination]:
        destination = MemoryDestination()
        pipeline = Pipeline(pipeline_config(pg_database, **sections), MemoryStore(pipeline_id=1), destination)
        pipeline.start()
        pipelines.append(pipeline)
        return pipeline, destination

    yield run
    for pipeline in pipelines:
        pipeline.shutdown()


def oid(db: TestDatabase, table: str) -> int:
    return int(db.execute("SELECT %s::regclass::oid", (table,))[0][0])


def test_tables_added_and_removed_at_runtime(pg_database: TestDatabase, start: Start) -> None:
    db = pg_database
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text); INSERT INTO a VALUES (1, 'one')")
    db.execute("CREATE TABLE b (id int PRIMARY KEY, v text); INSERT INTO b VALUES (1, 'uno'), (2, 'dos')")
    db.execute("CREATE PUBLICATION pub FOR TABLE a")
    pipeline, destination = start()
    wait_until(lambda: all_ready(pipeline, 1), "table a ready", pipeline)

    db.execute("ALTER PUBLICATION pub ADD TABLE b")
    db.execute("INSERT INTO b VALUES (3, 'tres')")
    wait_until(lambda: all_ready(pipeline, 2), "table b picked up without a restart", pipeline)
    db.execute("UPDATE b SET v = 'TRES' WHERE id = 3; INSERT INTO a VALUES (2, 'two')")
    wait_until(lambda: destination_matches(db, destination, "public.a", "public.b"), "a and b streamed", pipeline)

    db.execute("ALTER PUBLICATION pub DROP TABLE b")
    wait_until(lambda: oid(db, "b") not in table_states(pipeline), "table b forgotten", pipeline)
    db.execute("INSERT INTO b VALUES (4, 'cuatro'); INSERT INTO a VALUES (3, 'three')")
    wait_until(lambda: destination_matches(db, destination, "public.a"), "a still streams", pipeline)
    assert [r["id"] for r in destination.rows("public.b")] == [1, 2, 3]
    slots = db.execute("SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'etl_sync_%%'")
    assert slots == []


def test_single_table_resync_while_others_stream(pg_database: TestDatabase, start: Start) -> None:
    db = pg_database
    db.execute("CREATE TABLE a (id int PRIMARY KEY, v text); INSERT INTO a SELECT g, 'a' FROM generate_series(1, 50) g")
    db.execute("CREATE TABLE b (id int PRIMARY KEY, v text); INSERT INTO b SELECT g, 'b' FROM generate_series(1, 50) g")
    db.execute("CREATE PUBLICATION pub FOR TABLE a, b")
    pipeline, destination = start()
    wait_until(lambda: all_ready(pipeline, 2), "tables ready", pipeline)
    # Damage the destination's copy of a, as a faulty destination might; a resync must repair it.
    destination.drop_table_for_copy(destination.schema("public.a"))
    pipeline.resync(oid(db, "a"))
    db.execute("INSERT INTO b VALUES (51, 'during resync'); UPDATE a SET v = 'changed' WHERE id < 10")
    wait_until(
        lambda: destination_matches(db, destination, "public.a", "public.b") and all_ready(pipeline, 2),
        "a copied again and both streaming",
        pipeline,
    )
    db.execute("DELETE FROM a WHERE id = 1; INSERT INTO b VALUES (52, 'after')")
    wait_until(lambda: destination_matches(db, destination, "public.a", "public.b"), "streaming after resync", pipeline)


def test_errored_table_does_not_stop_the_others(pg_database: TestDatabase, start: Start) -> None:
    db = pg_database
    db.execute("CREATE TABLE good (id int PRIMARY KEY, v text); INSERT INTO good VALUES (1, 'x')")
    db.execute("CREATE TABLE bad_copy (id int PRIMARY KEY, n numeric(6,2)); INSERT INTO bad_copy VALUES (1, 'NaN')")
    db.execute("CREATE TABLE bad_stream (id int PRIMARY KEY, n numeric(6,2)); INSERT INTO bad_stream VALUES (1, 1.5)")
    db.execute("CREATE PUBLICATION pub FOR TABLE good, bad_copy, bad_stream")
    pipeline, destination = start()
    states = pipeline.states
    assert states is not None

    def kind(table: str) -> TableStateKind | None:
        state = states.get(oid(db, table))
        return state.kind if state is not None else None

    wait_until(lambda: kind("bad_copy") is TableStateKind.ERRORED, "bad_copy errored during copy", pipeline)
    wait_until(lambda: kind("good") is TableStateKind.READY and kind("bad_stream") is TableStateKind.READY, "ready")
    errored = states.get(oid(db, "bad_copy"))
    assert errored is not None and errored.reason is not None and "NaN" in errored.reason
    db.execute("INSERT INTO bad_stream VALUES (2, 'NaN'); INSERT INTO good VALUES (2, 'y')")
    wait_until(lambda: kind("bad_stream") is TableStateKind.ERRORED, "bad_stream errored while streaming", pipeline)
    db.execute("INSERT INTO good VALUES (3, 'z')")
    wait_until(lambda: destination_matches(db, destination, "public.good"), "good keeps streaming", pipeline)
    assert kind("good") is TableStateKind.READY


@pytest.mark.parametrize("identity", ["DEFAULT", "FULL"])
def test_unchanged_toast_values_survive_updates(pg_database: TestDatabase, start: Start, identity: str) -> None:
    db = pg_database
    db.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, body text)")
    db.execute(f"ALTER TABLE docs REPLICA IDENTITY {identity}")
    db.execute("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")  # out of line, uncompressed
    db.execute("CREATE PUBLICATION pub FOR TABLE docs")
    pipeline, destination = start()
    wait_until(lambda: all_ready(pipeline, 1), "ready", pipeline)
    db.execute("INSERT INTO docs SELECT g, 't' || g, repeat(md5(g::text), 400) FROM generate_series(1, 5) g")
    wait_until(lambda: destination_matches(db, destination, "public.docs"), "inserted", pipeline)
    db.execute("UPDATE docs SET title = 'renamed' WHERE id <= 3")  # body unchanged: sent as unchanged TOAST
    wait_until(lambda: destination_matches(db, destination, "public.docs"), "toast kept", pipeline)
    assert all(len(r["body"]) == 12800 for r in destination.rows("public.docs"))


def test_replica_identity_using_index(pg_database: TestDatabase, start: Start) -> None:
    db = pg_database
    db.execute("CREATE TABLE u (id int NOT NULL, code text NOT NULL, v text)")
    db.execute("CREATE UNIQUE INDEX u_code ON u (code); ALTER TABLE u REPLICA IDENTITY USING INDEX u_code")
    db.execute("INSERT INTO u VALUES (1, 'a', 'x'), (2, 'b', 'y')")
    db.execute("CREATE PUBLICATION pub FOR TABLE u")
    pipeline, destination = start()
    wait_until(lambda: all_ready(pipeline, 1), "ready", pipeline)
    db.execute("UPDATE u SET v = 'z' WHERE code = 'a'; UPDATE u SET code = 'c' WHERE code = 'b'")
    db.execute("DELETE FROM u WHERE code = 'a'; INSERT INTO u VALUES (3, 'd', NULL)")
    wait_until(lambda: destination_matches(db, destination, "public.u"), "changes by index key", pipeline)


@pytest.mark.parametrize("via_root", [True, False])
def test_partitioned_tables(pg_database: TestDatabase, start: Start, via_root: bool) -> None:
    db = pg_database
    db.execute(
        """
        CREATE TABLE m (id int, at date, v text, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
        CREATE TABLE m_2025 PARTITION OF m FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
        CREATE TABLE m_2026 PARTITION OF m FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
        INSERT INTO m SELECT g, DATE '2025-06-01' + g, 'v' || g FROM generate_series(1, 300) g;
        """
    )
    db.execute(f"CREATE PUBLICATION pub FOR TABLE m WITH (publish_via_partition_root = {str(via_root).lower()})")
    tables = ["public.m"] if via_root else ["public.m_2025", "public.m_2026"]
    pipeline, destination = start()
    wait_until(lambda: all_ready(pipeline, len(tables)), "partitions ready", pipeline)
    db.execute("INSERT INTO m VALUES (1000, '2026-05-05', 'new'); UPDATE m SET v = 'upd' WHERE id % 7 = 0")
    db.execute("DELETE FROM m WHERE id % 11 = 0; UPDATE m SET at = '2026-12-01' WHERE id = 1")  # crosses partitions
    wait_until(lambda: destination_matches(db, destination, *tables), "partitioned changes", pipeline)
    assert destination.table_names() == sorted(TableName.parse(t) for t in tables)


def test_truncate_cascade_reaches_every_truncated_table(pg_database: TestDatabase, start: Start) -> None:
    db = pg_database
    db.execute("CREATE TABLE parent (id int PRIMARY KEY); INSERT INTO parent SELECT generate_series(1, 10)")
    db.execute("CREATE TABLE child (id int PRIMARY KEY, p int REFERENCES parent); INSERT INTO child VALUES (1, 1)")
    db.execute("CREATE TABLE other (id int PRIMARY KEY); INSERT INTO other VALUES (1)")
    db.execute("CREATE PUBLICATION pub FOR TABLE parent, child, other")
    pipeline, destination = start()
    wait_until(lambda: all_ready(pipeline, 3), "ready", pipeline)
    db.execute("TRUNCATE parent CASCADE")
    db.execute("INSERT INTO parent VALUES (42)")
    tables = ("public.parent", "public.child", "public.other")
    wait_until(lambda: destination_matches(db, destination, *tables), "cascaded truncate", pipeline)
    assert destination.rows("public.child") == [] and destination.rows("public.other") == [{"id": 1}]


def test_stored_generated_columns_arrive_where_the_server_publishes_them(
    pg_database: TestDatabase, start: Start, pg_major: int
) -> None:
    """Postgres 18 publishes stored generated columns with `publish_generated_columns = stored`: copied and
    streamed. Before 18 nothing publishes them, and the destination has the other columns; virtual ones
    (Postgres 18) are never published."""
    db = pg_database
    virtual = ", half int GENERATED ALWAYS AS (a / 2) VIRTUAL" if pg_major >= 18 else ""
    db.execute(f"CREATE TABLE g (id int PRIMARY KEY, a int, total int GENERATED ALWAYS AS (a * 10) STORED{virtual})")
    db.execute("INSERT INTO g (id, a) SELECT i, i FROM generate_series(1, 20) i")
    db.execute(
        "CREATE PUBLICATION pub FOR TABLE g" + (" WITH (publish_generated_columns = stored)" if pg_major >= 18 else "")
    )
    pipeline, destination = start()
    wait_until(lambda: all_ready(pipeline, 1), "copied", pipeline)
    db.execute("UPDATE g SET a = a + 100 WHERE id % 3 = 0; INSERT INTO g (id, a) VALUES (21, 7)")
    published = ["id", "a", "total"] if pg_major >= 18 else ["id", "a"]

    def equal() -> bool:
        with db.connect() as conn:
            expected = [{k: r[k] for k in published} for r in source_rows(conn, "public.g")]
        try:
            return destination.rows("public.g") == expected
        except KeyError:
            return False

    wait_until(equal, "the published columns copied and streamed", pipeline)


class SlowWrites(MemoryDestination):
    """The memory destination, each of whose streamed writes takes ``seconds`` (a destination slower than the
    server's ``wal_sender_timeout``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def write_events(self, batch: EventBatch) -> WriteResult:
        time.sleep(self.seconds)
        return super().write_events(batch)


def test_a_write_longer_than_wal_sender_timeout_keeps_the_replication_connection(pg_database: TestDatabase) -> None:
    """The walsender ends a connection that sends no status update for ``wal_sender_timeout``: updates keep flowing
    while a destination write runs, however long it takes."""
    db = pg_database
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE t")
    db.execute(f"ALTER DATABASE \"{db.name}\" SET wal_sender_timeout = '1s'")  # the walsender reads it at connect
    pipeline = Pipeline(pipeline_config(db), MemoryStore(pipeline_id=1), destination := SlowWrites(3.5))
    pipeline.start()
    try:
        wait_until(lambda: all_ready(pipeline, 1), "the copy", pipeline)
        query = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'etl_apply_1'"
        walsender = db.execute(query)[0][0]
        with db.connect() as fresh:  # a session started after the ALTER, as the walsender's was
            assert fresh.execute("SHOW wal_sender_timeout").fetchone() == ("1s",)
        for i in range(3):
            db.execute("INSERT INTO t VALUES (%s, 'during a slow write')", (i,))
            time.sleep(0.5)
        wait_until(lambda: destination_matches(db, destination, "public.t"), "the rows, after slow writes", pipeline)
        assert db.execute(query) == [(walsender,)], "the replication connection was ended and made again"
        assert pipeline.metrics.registry.get_sample_value("etl_reconnects_total") in (None, 0.0)
    finally:
        pipeline.shutdown()
