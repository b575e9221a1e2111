"""``[copy] method = "incremental"``: tables copied in key-ordered chunks while every table streams, resumed after a
stop from the last chunk written, and no transaction of the source held open for the copy."""

from __future__ import annotations

import sqlite3
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import duckdb
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from etl.config import PipelineConfig
from etl.copy_plan import CopyPlan
from etl.destination.base import ChunkCopier, Destination, StagedChunk, WriteResult
from etl.destination.memory import MemoryDestination
from etl.errors import StoreError
from etl.events import EventBatch
from etl.factory import build_destination
from etl.lsn import Lsn
from etl.pipeline import Pipeline, request_resync
from etl.replication.incremental import CHUNK_ORDINAL_BASE, ChunkMark
from etl.schema import TableName
from etl.status import status_report
from etl.store.base import Store, TableStateKind
from etl.testing import free_port
from etl.testing.compare import source_rows
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, poll, table_states, wait_until
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config
from etl.testing.workload import concurrent_transactions
from etl_spark.ducklake.reader import open_lake
from etl_spark.session import running_master, stop_spark
from etl_spark.testing import lake_matches
from etl_store_sqlite.store import SqliteStore

ROWS = 40_000


@pytest.fixture
def source(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        f"""
        CREATE TABLE big (id bigint PRIMARY KEY, v text, n int);
        INSERT INTO big SELECT g, 'row ' || g, g % 97 FROM generate_series(1, {ROWS}) g;
        CREATE TABLE other (id int PRIMARY KEY, v text);
        INSERT INTO other SELECT g, 'o' FROM generate_series(1, 100) g;
        CREATE TABLE keyless (a int, b text);
        ALTER TABLE keyless REPLICA IDENTITY FULL;
        INSERT INTO keyless SELECT g, 'k' FROM generate_series(1, 100) g;
        CREATE PUBLICATION pub FOR TABLE big, other, keyless;
        ANALYZE big;
        """
    )
    return pg_database


def start(db: TestDatabase, destination: MemoryDestination, state: Path, **copy: Any) -> Pipeline:
    config = pipeline_config(db, copy={"method": "incremental", "chunk_rows": 2000} | copy)
    pipeline = Pipeline(config, SqliteStore(state, pipeline_id=1), destination)
    pipeline.start()
    return pipeline


def workload(conn: psycopg.Connection[Any], i: int) -> None:
    """Changes all over the table, to keys copied, being copied and not copied yet: inserts, updates, key changes
    both ways across the copy's position, deletes; and a change to another table."""
    n = ROWS // 200 * (i % 200) + 1
    conn.execute("INSERT INTO big VALUES (%s, 'new', 0)", (ROWS + 1 + i,))
    conn.execute("UPDATE big SET v = v || '+', n = n + 1 WHERE id = %s", (n,))
    conn.execute("UPDATE big SET id = %s WHERE id = %s", (3 * ROWS + i if i % 2 else -1 - i, n + 7))
    conn.execute("DELETE FROM big WHERE id = %s", (n + 13,))
    conn.execute("UPDATE other SET v = v || '+' WHERE id = %s", (i % 100 + 1,))


def test_an_incremental_copy_under_a_workload_equals_the_source(source: TestDatabase, tmp_path: Path) -> None:
    destination = MemoryDestination()
    pipeline = start(source, destination, tmp_path / "state.sqlite")
    try:
        with concurrent_transactions(source, workload, 400, pause=0.005):
            wait_until(
                lambda: table_states(pipeline).get(oid(source, "big")) is TableStateKind.COPYING, "copying", pipeline
            )
        wait_until(lambda: all_ready(pipeline, 3), "every table ready", pipeline, timeout=180)
        wait_until(
            lambda: destination_matches(source, destination, "public.big", "public.other", "public.keyless"),
            "equal to the source",
            pipeline,
        )
        with source.connect() as conn:
            slots = [r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()]
        assert slots == ["etl_apply_1"]  # keyless was copied by snapshot, and its slot is gone since
    finally:
        pipeline.shutdown()


def test_a_key_of_collated_text_and_uuid_copies_in_chunks_under_a_workload(
    pg_database: TestDatabase, tmp_path: Path
) -> None:
    """A key of (text under a collation whose order is not the bytes', where the server has one; uuid): the chunks
    walk its index in the source's order, and the source tells which of the stream's changes are to keys copied,
    being copied or not copied yet (keys moved both ways across the copy's position): the copy equals the
    source."""
    db = pg_database
    create_keyed_items(db, ROWS)
    db.execute("ANALYZE items; CREATE PUBLICATION pub FOR TABLE items, ledger")
    destination = MemoryDestination()
    pipeline = start(db, destination, tmp_path / "state.sqlite")
    try:
        items = oid(db, "items")
        with concurrent_transactions(db, partial(spread_churn, rows=ROWS), 400, pause=0.005):
            wait_until(lambda: table_states(pipeline).get(items) is TableStateKind.COPYING, "copying", pipeline)
        wait_until(lambda: all_ready(pipeline, 2), "every table ready", pipeline, timeout=180)
        wait_until(lambda: destination_matches(db, destination, "public.items", "public.ledger"), "equal", pipeline)
    finally:
        pipeline.shutdown()
    assert len(recorded_after(tmp_path / "state.sqlite", items)) == 2  # copied in chunks, by both key columns


def copied_rows(pipeline: Pipeline, table: str) -> float:
    return pipeline.metrics.registry.get_sample_value("etl_copied_rows_total", {"table": table}) or 0.0


def test_a_stopped_copy_goes_on_from_its_last_chunk(source: TestDatabase, tmp_path: Path) -> None:
    """Stopped about half-way, the copy is taken up by the next run where it stood: that run copies the rest only,
    as its own etl_copied_rows_total counts."""
    destination = MemoryDestination()
    first = start(source, destination, tmp_path / "state.sqlite", chunk_rows=1000)
    try:
        wait_until(lambda: copied_rows(first, "public.big") >= ROWS // 2, "half of the copy", first)
    finally:
        first.shutdown()
    assert table_states_in(tmp_path / "state.sqlite")[oid(source, "big")] is TableStateKind.COPYING
    source.execute("UPDATE big SET v = 'changed while stopped' WHERE id % 1000 = 0")
    second = start(source, destination, tmp_path / "state.sqlite", chunk_rows=1000)
    try:
        wait_until(lambda: all_ready(second, 3), "every table ready", second, timeout=180)
        wait_until(lambda: destination_matches(source, destination, "public.big"), "equal to the source", second)
        assert 0 < copied_rows(second, "public.big") <= 0.6 * ROWS
    finally:
        second.shutdown()


def memory_sink(tmp_path: Path) -> tuple[dict[str, Any] | None, Callable[[], None]]:
    return None, lambda: None


def ducklake_on_a_cluster(tmp_path: Path) -> tuple[dict[str, Any] | None, Callable[[], None]]:
    if running_master() is not None:
        stop_spark()
    lake = {"type": "ducklake", "catalog": f"sqlite:///{tmp_path}/catalog.sqlite", "data_path": f"{tmp_path}/data/"}
    spark = {"master": "local-cluster[2,1,1024]", "conf": {"spark.sql.shuffle.partitions": "2"}}
    return lake | {"spark": spark, "driver_copy_max_bytes": 0}, stop_spark  # every chunk by Spark tasks


@pytest.mark.parametrize(
    "sink",
    [
        pytest.param(memory_sink, id="memory"),
        pytest.param(
            ducklake_on_a_cluster,
            id="ducklake",
            marks=[pytest.mark.slow, pytest.mark.xdist_group("local-cluster"), pytest.mark.first_major],
        ),
    ],
)
def test_the_copy_holds_back_no_vacuum(
    source: TestDatabase,
    tmp_path: Path,
    sink: Callable[[Path], tuple[dict[str, Any] | None, Callable[[], None]]],
) -> None:
    """While the copy runs, no backend of the source database keeps a snapshot older than a chunk's read: a
    transaction committed before two chunks are read is older than every backend's xmin, whoever opened it (the
    engine, or Spark's tasks reading DuckLake's chunks on executors of their own; a snapshot copy holds one
    snapshot, and with it the source's xmin horizon, for the whole table: so the checks begin once the keyless
    table, which only a snapshot copy can take, is copied)."""
    lake, stop = sink(tmp_path)
    into = {} if lake is None else {"destination": lake}
    config = pipeline_config(source, copy={"method": "incremental", "chunk_rows": 100}, **into)
    store = SqliteStore(tmp_path / "state.sqlite", pipeline_id=1)
    pipeline = Pipeline(config, store, MemoryDestination() if lake is None else build_destination(config, store, "t"))
    pipeline.start()
    checked = 0
    try:
        keyless = oid(source, "keyless")
        wait_until(lambda: table_states(pipeline).get(keyless) is TableStateKind.READY, "keyless copied", pipeline, 180)
        while table_states(pipeline).get(oid(source, "big")) is not TableStateKind.READY:
            before = copied_rows(pipeline, "public.big")
            committed = int(source.execute("SELECT txid_current()")[0][0])
            wait_until(
                lambda b=before: copied_rows(pipeline, "public.big") >= b + 200, "two chunks", pipeline, timeout=120
            )
            held = source.execute(
                "SELECT pid, application_name, state, query, backend_xmin::text FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_xmin IS NOT NULL"
                " AND age(backend_xmin) >= age(%s::text::xid)",
                (str(committed % 2**32),),
            )
            assert held == [], f"backends hold snapshots from before xid {committed}: {held}"
            checked += 1
            if checked == 5:
                break
    finally:
        pipeline.shutdown()
        stop()
    assert checked == 5, "the copy ended before it was checked five times; make the table bigger"


class KilledStore(SqliteStore):
    """Stands in for the store of a run killed (SIGKILL) at a moment a test picks: once ``killed`` is set it
    writes nothing more (every write fails, as it would with its process gone)."""

    def __init__(self, path: Path, killed: threading.Event) -> None:
        super().__init__(path, pipeline_id=1)
        self.killed = killed

    def _check_lock(self) -> None:
        if self.killed.is_set():
            raise StoreError("the run was killed", hint="none: a test killed it")
        super()._check_lock()


class Chunks:
    """A destination that counts how the chunks of ``table`` come (batches through ``write_events``, or plans
    through ``commit_chunk``), and whose run is killed (``killed``) right after it made durable the first chunk
    that starts past key ``kill_after``, before the store records it: from then on it keeps none of the run's
    writes. Everything else is the wrapped destination's."""

    def __init__(self, inner: Destination, table: int, killed: threading.Event, kill_after: int | None) -> None:
        self.inner, self.table, self.killed, self.kill_after = inner, table, killed, kill_after
        self.batches = self.plans = 0
        self.on_flush = False
        self.staged: dict[int, CopyPlan] = {}
        if isinstance(inner, ChunkCopier):  # a copier only when the wrapped destination is one
            self.stage_chunk, self.commit_chunk = self._stage_chunk, self._commit_chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write_events(self, batch: EventBatch) -> WriteResult:
        if self.killed.is_set():
            return WriteResult.DURABLE
        result = self.inner.write_events(batch)
        segments = batch.changes.get(self.table, []) if batch.last_commit_lsn == Lsn.ZERO else []
        if segments:
            self.batches += 1
            first = min(pc.min(s.table.column("id")).as_py() for s in segments)
            if self._killing(first - 1) and result is WriteResult.DURABLE:
                self.killed.set()
        return result

    def _stage_chunk(self, plan: CopyPlan, watermark: tuple[Lsn, int], stop: threading.Event) -> StagedChunk:
        assert isinstance(self.inner, ChunkCopier)
        staged = self.inner.stage_chunk(plan, watermark, stop)
        self.staged[id(staged)] = plan
        return staged

    def _commit_chunk(self, staged: StagedChunk) -> int:
        if self.killed.is_set():
            return 0  # the run is dead: nothing it writes is kept
        assert isinstance(self.inner, ChunkCopier)
        written = self.inner.commit_chunk(staged)
        plan = self.staged.pop(id(staged))
        if plan.schema.id == self.table:
            self.plans += 1
            chunk = plan.ranges[0].key_chunk
            if self._killing(int(chunk.after[0]) if chunk is not None and chunk.after else None):
                self.killed.set()
        return written

    def _killing(self, after: int | None) -> bool:
        self.on_flush = self.kill_after is not None and after is not None and after >= self.kill_after
        return self.on_flush

    def flush(self) -> None:
        if not self.killed.is_set():
            self.inner.flush()
            if self.on_flush:
                self.killed.set()


def run_killed_after_a_chunk(
    source: TestDatabase, config: PipelineConfig, state: Path, destination: Callable[[Store], Destination]
) -> tuple[Chunks, Pipeline, Chunks]:
    """Run a pipeline into ``destination`` until it is killed right after writing the chunk of keys 20,001 to
    21,000, then change rows of that chunk at the source, and start a second run: the first run's chunks, the second
    run and its chunks."""
    killed, table = threading.Event(), oid(source, "big")
    store = KilledStore(state, killed)
    first = Chunks(destination(store), table, killed, kill_after=20_000)
    run = Pipeline(config, store, cast(Destination, first))
    run.start()
    try:
        wait_until(killed.is_set, "the chunk after key 20,000 written", timeout=180)
    finally:
        with pytest.raises(StoreError, match="the run was killed"):  # its next write failed the run
            run.shutdown(timeout=60)
    assert recorded_after(state, table) == ("20000",), "the chunk is not recorded"
    source.execute(
        """
        DELETE FROM big WHERE id BETWEEN 20100 AND 20199;
        UPDATE big SET id = id + 1000000 WHERE id BETWEEN 20300 AND 20309;
        UPDATE big SET v = 'changed while down' WHERE id BETWEEN 20400 AND 20409;
        """
    )
    store = SqliteStore(state, pipeline_id=1)
    second = Chunks(destination(store), table, threading.Event(), kill_after=None)
    run = Pipeline(config, store, cast(Destination, second))
    run.start()
    return first, run, second


def test_a_run_killed_between_a_chunks_write_and_its_record_leaves_no_stale_row(
    source: TestDatabase, tmp_path: Path
) -> None:
    """The run dies right after its destination made a chunk durable, before the store recorded the chunk. While
    it is down, rows of that chunk are deleted, moved to another key and changed at the source. The next run reads
    the chunk again: the destination ends equal to the source, without the rows deleted or moved since."""
    memory = MemoryDestination()
    config = pipeline_config(source, copy={"method": "incremental", "chunk_rows": 1000})
    _, second, _ = run_killed_after_a_chunk(source, config, tmp_path / "state.sqlite", lambda _: memory)
    try:
        wait_until(lambda: all_ready(second, 3), "every table ready", second, timeout=180)
        wait_until(lambda: destination_matches(source, memory, "public.big"), "equal to the source", second)
    finally:
        second.shutdown()


@pytest.mark.slow
@pytest.mark.xdist_group("local-cluster")
@pytest.mark.first_major  # DuckLake's side of it; the memory destination's twin above runs on every major
def test_ducklake_chunks_are_copied_by_executors_and_a_run_killed_between_write_and_record_loses_nothing(
    source: TestDatabase, tmp_path: Path
) -> None:
    """Into DuckLake on a standalone cluster of two executor JVMs: each chunk is read and written by Spark tasks
    (``stage_chunk``, ``commit_chunk``), none as a batch through the driver. Killed as above, the next run writes the
    chunk the dead run wrote again as a batch (of updates: the lake holds some of its keys), and the rest by tasks
    again. DuckDB reads the source's rows: no stale row, and none twice."""
    if running_master() is not None:
        stop_spark()
    lake = {"type": "ducklake", "catalog": f"sqlite:///{tmp_path}/catalog.sqlite", "data_path": f"{tmp_path}/data/"}
    spark = {"master": "local-cluster[2,1,1024]", "conf": {"spark.sql.shuffle.partitions": "2"}}
    config = pipeline_config(
        source,
        copy={"method": "incremental", "chunk_rows": 1000},
        destination=lake | {"spark": spark, "driver_copy_max_bytes": 0},  # every chunk by Spark tasks
    )
    first, second, chunks = run_killed_after_a_chunk(
        source, config, tmp_path / "state.sqlite", lambda store: build_destination(config, store, "test")
    )
    try:
        wait_until(lambda: all_ready(second, 3), "every table ready", second, timeout=240)

        def equal() -> bool:
            with source.connect() as conn:
                return lake_matches(conn, lake["catalog"], "public.big")

        wait_until(equal, "DuckDB reading the source's rows", second, timeout=120)
    finally:
        second.shutdown()
        stop_spark()
    assert (first.plans, first.batches) == (21, 0), "the first run's 21 chunks, all by Spark tasks"
    assert chunks.batches == 1, "the dead run's chunk written again as a batch"
    assert chunks.plans > 0, "the chunks after it by Spark tasks"


BACKFILLED = 20_000
"""The backfill's predicate picks the rows up to this key (and the workload's negative keys)."""


class HeldChunks(MemoryDestination):
    """Holds the write of a chunk (a batch that commits nothing) once ``hold_after`` chunks were written, until
    ``go`` is set: a test stops the pipeline part-way through a copy however fast the copy runs."""

    def __init__(self) -> None:
        super().__init__()
        self.hold_after: int | None = None
        self.chunks = 0
        self.held = threading.Event()
        self.go = threading.Event()

    def write_events(self, batch: EventBatch) -> WriteResult:
        if self.hold_after is not None and batch.last_commit_lsn == Lsn.ZERO and batch.table_ids:
            self.chunks += 1
            if self.chunks > self.hold_after:
                self.held.set()
                self.go.wait(120)
        return super().write_events(batch)


def test_a_backfill_copies_again_the_rows_its_predicate_picks_and_goes_on_after_a_stop(
    source: TestDatabase, tmp_path: Path
) -> None:
    """``etl resync --where``: the rows the predicate picks are copied again, in chunks, into the table as it is,
    while its changes stream on. Here every tenth row of the destination was changed behind the pipeline's back:
    those the predicate picks are mended, the others stay as they were. Stopped part-way, the next run goes on
    with the same predicate after the last chunk written, not with a copy of the whole table."""
    destination = HeldChunks()
    state = tmp_path / "state.sqlite"
    first = start(source, destination, state, method="snapshot", chunk_rows=500)
    try:
        wait_until(lambda: all_ready(first, 3), "every table ready", first, timeout=180)
        wait_until(lambda: destination_matches(source, destination, "public.big"), "copied", first)
        schema = destination.schema("public.big")
        tampered = list(range(1, ROWS + 1, 10))
        destination.write_table_rows(  # as a copy writes: the rows of these keys replaced
            schema,
            pa.table(
                {"id": pa.array(tampered, pa.int64()), "v": ["tampered"] * len(tampered), "n": [-1] * len(tampered)},
                schema=pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string()), pa.field("n", pa.int32())]),
            ),
        )
        where = f"id <= {BACKFILLED} AND v LIKE 'row %' OR v = 'new'"  # quotes, a %, and rows the workload adds
        asking = SqliteStore(state, pipeline_id=1)
        try:
            request_resync(first.config, asking, TableName("public", "big"), where)
        finally:
            asking.close()
        copied = copied_rows(first, "public.big")  # the first copy's
        destination.hold_after = 10
        with concurrent_transactions(source, workload, 150, pause=0.01):
            wait_until(destination.held.is_set, "ten chunks of the backfill", first)
        assert copied_rows(first, "public.big") >= copied + 5000
        first.request_stop()  # stopped part-way: the eleventh chunk's write ends after the stop
    finally:
        destination.go.set()
        first.shutdown()
    assert table_states_in(state)[oid(source, "big")] is TableStateKind.COPYING
    second = start(source, destination, state, method="snapshot", chunk_rows=500)
    try:
        wait_until(lambda: all_ready(second, 3), "the backfill done", second, timeout=180)
        assert 0 < copied_rows(second, "public.big") <= BACKFILLED - 5000 + 200, "the rest of the backfill only"
        with source.connect() as conn:
            expected = {r["id"]: r for r in source_rows(conn, "public.big")}
        held = {r["id"]: r for r in destination.rows("public.big")}
        assert held.keys() == expected.keys()
        mended = [k for k in tampered if k <= BACKFILLED and k in expected]
        assert all(held[k] == expected[k] for k in mended)
        left = [k for k in tampered if k > BACKFILLED and held[k]["v"] == "tampered"]
        assert len(left) > 0.9 * (ROWS - BACKFILLED) / 10, "rows the predicate does not pick are not copied"
        assert all(held[k] == r for k, r in expected.items() if k not in left), "every other row equals the source"
    finally:
        second.shutdown()


MILLIONS = 2_000_000


TENANTS = ("a", "B", "b", "A", "é", "e", "ab", "Ab")
"""Under ICU's root collation a < A < ab < Ab < b < B < e < é; in bytes A < Ab < B < a < ab < b < e < é."""


def create_keyed_items(db: TestDatabase, rows: int = MILLIONS) -> None:
    """``items`` of ``rows`` rows keyed by (tenant text under ``TestDatabase.text_collation``, uid uuid), its key's
    index the copy's order, and a unique ``id`` beside it that the test compares by; ``ledger`` of 2,000 rows."""
    db.execute(
        f"""
        CREATE TABLE ledger (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, item bigint, delta int);
        INSERT INTO ledger (item, delta) SELECT g % 1000, g % 7 - 3 FROM generate_series(1, 2000) g;
        CREATE TABLE items (
            tenant text COLLATE {db.text_collation()}, uid uuid, id bigint NOT NULL UNIQUE, name text, qty int,
            updated timestamptz, PRIMARY KEY (tenant, uid));
        INSERT INTO items SELECT (ARRAY{list(TENANTS)!r})[1 + g % {len(TENANTS)}], md5(g::text)::uuid, g,
            'item ' || g, g % 100, timestamptz '2026-01-01 00:00+00' + g * interval '1 s'
            FROM generate_series(1, {int(rows)}) g;
        """
    )


def spread_churn(conn: psycopg.Connection[Any], i: int, rows: int = MILLIONS) -> None:
    """Changes all over a table of ``rows`` items (``create_keyed_items``), to keys copied, being copied and not
    copied yet: an insert, an update, a key moved to another tenant (before or after the copy's position) and uid, a
    delete; and a ledger row."""
    n = (i * 7919) % (rows - 10) + 1
    tenant, other = TENANTS[i % len(TENANTS)], TENANTS[(i * 3 + 1) % len(TENANTS)]
    conn.execute(
        "INSERT INTO items VALUES (%s, md5(%s)::uuid, %s, 'new', 0, now())", (tenant, f"new {i}", 3 * rows + i)
    )
    conn.execute("UPDATE items SET qty = qty + 1, name = name || '+' WHERE id = %s", (n,))
    conn.execute("UPDATE items SET tenant = %s, uid = md5(%s)::uuid WHERE id = %s", (other, f"moved {i}", n + 3))
    conn.execute("DELETE FROM items WHERE id = %s", (n + 5,))
    conn.execute("INSERT INTO ledger (item, delta) VALUES (%s, 1)", (i,))


@dataclass(frozen=True)
class Sink:
    """Where the two-million-row test copies to, and how it reads it back with its own reader: each table's rows,
    ordered by key, as the source's query and the sink's read them (timestamps alike), and its rows so far."""

    destination: dict[str, Any]
    connect: Callable[[], Any]
    """A DB-API connection that reads the sink."""
    compared: dict[str, tuple[str, str]]
    """Table -> (the source's query, the sink's query)."""
    names: dict[str, str]
    """Table -> its name in the sink's SQL."""
    copied: Callable[[], int]
    """Rows of ``items`` in the sink so far (about what the copy wrote)."""


def ducklake_sink(tmp_path: Path) -> Sink:
    catalog = tmp_path / "catalog.sqlite"
    spark = {"master": "local-cluster[2,1,1024]", "conf": {"spark.sql.shuffle.partitions": "2"}}
    lake = {"type": "ducklake", "catalog": f"sqlite:///{catalog}", "data_path": f"{tmp_path}/data/", "spark": spark}
    return Sink(
        lake,
        lambda: open_lake(lake["catalog"], read_only=True),
        {
            "items": (
                "SELECT id, tenant, uid::text, name, qty, (extract(epoch FROM updated) * 1000000)::bigint FROM items"
                " ORDER BY id",
                "SELECT id, tenant, uid::VARCHAR, name, qty, epoch_us(updated) FROM lake.public.items ORDER BY id",
            ),
            "ledger": (LEDGER, "SELECT id, item, delta FROM lake.public.ledger ORDER BY id"),
        },
        {"items": "lake.public.items", "ledger": "lake.public.ledger"},
        lambda: rows_in_lake_files(catalog, "items"),
    )


def mirror_sink(tmp_path: Path) -> Sink:
    mirror = tmp_path / "mirror.sqlite"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(f"file:{mirror}?mode=ro", uri=True, timeout=5)

    def copied() -> int:
        try:
            with closing(connect()) as con:
                return int(con.execute('SELECT count(*) FROM "public.items"').fetchone()[0])
        except sqlite3.OperationalError:  # no mirror, or no table, yet
            return 0

    return Sink(
        {"type": "sqlite_mirror", "path": str(mirror)},
        connect,
        {
            "items": (
                "SELECT id, tenant, uid::text, name, qty,"
                " to_char(updated AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || '+00:00' FROM items ORDER BY id",
                'SELECT id, tenant, uid, name, qty, updated FROM "public.items" ORDER BY id',
            ),
            "ledger": (LEDGER, 'SELECT id, item, delta FROM "public.ledger" ORDER BY id'),
        },
        {"items": '"public.items"', "ledger": '"public.ledger"'},
        copied,
    )


LEDGER = "SELECT id, item, delta FROM ledger ORDER BY id"
TALLY = "SELECT count(*), coalesce(sum(id), 0) FROM {}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_sink",
    [
        # DuckLake's side on the first major; the mirror, the engine's own path, on every major
        pytest.param(
            ducklake_sink, id="ducklake", marks=[pytest.mark.xdist_group("local-cluster"), pytest.mark.first_major]
        ),
        pytest.param(mirror_sink, id="sqlite-mirror"),
    ],
)
def test_sigkill_three_times_during_an_incremental_copy_of_two_million_rows(
    pg_database: TestDatabase, tmp_path: Path, make_sink: Callable[[Path], Sink]
) -> None:
    """etl run killed (SIGKILL) three times as the copy passes a quarter, a half and three quarters of a table of
    two million rows keyed by text (under a collation whose order is not the bytes') and uuid, while transactions
    change it (keys moved both ways across the copy's position) and another table; then both read back equal to the
    source,
    row for row, and the run started after the last kill copied the rest of the table only (its own
    ``etl_copied_rows_total``). Into DuckLake on a standalone cluster of two executor JVMs (the chunks copied by
    Spark's tasks), and into the SQLite mirror (the engine's own path: chunks as batches)."""
    db, sink = pg_database, make_sink(tmp_path)
    create_keyed_items(db)
    db.execute("ANALYZE items; CREATE PUBLICATION pub FOR TABLE items, ledger")
    state, port = tmp_path / "state.sqlite", free_port()
    config = pipeline_config(
        db,
        copy={"method": "incremental", "chunk_rows": 100_000},
        store={"type": "sqlite", "path": str(state)},
        destination=sink.destination,
        metrics={"listen": f"127.0.0.1:{port}"},
    )
    with PipelineProcess(write_config(tmp_path / "pipeline.toml", config)) as runner:

        def copied_so_far() -> int:
            runner.ensure_alive()
            return sink.copied()

        def wait_for_quarters(quarters: int) -> None:
            what = f"the copy to reach {quarters} quarter(s)"
            poll(copied_so_far, what, until=lambda n: n >= quarters * MILLIONS // 4, timeout=300, least=0.2)

        runner.start()
        with concurrent_transactions(db, spread_churn, count=1500, pause=0.02, timeout=600):
            for quarter in (1, 2, 3):
                wait_for_quarters(quarter)
                runner.kill()
                runner.start()

        def source() -> list[tuple[int, int]]:
            return [tuple(map(int, db.execute(TALLY.format(t))[0])) for t in sink.compared]

        def copied() -> list[tuple[int, int]]:
            with closing(sink.connect()) as con:
                return [tuple(map(int, con.execute(TALLY.format(sink.names[t])).fetchall()[0])) for t in sink.compared]

        runner.wait_equal(source, copied, not_yet=(duckdb.Error, sqlite3.Error), timeout=300, interval=1)
        with closing(sink.connect()) as con, db.connect() as conn:  # then row for row
            for table, (theirs, ours) in sink.compared.items():
                sink_cursor = con.execute(ours)
                with conn.transaction(), conn.cursor(name=f"rows_{table}") as source_cursor:
                    source_cursor.execute(theirs)
                    while batch := source_cursor.fetchmany(100_000):
                        assert sink_cursor.fetchmany(len(batch)) == batch, f"{table}: the copy differs"
                assert sink_cursor.fetchmany(1) == [], f"{table}: the copy holds rows the source does not"
        copied_here = copied_rows_served(port, "public.items")  # by the run started after the last kill
        assert 0 < copied_here <= 0.35 * MILLIONS, f"the last run copied {copied_here:,.0f} rows, not the rest only"
        # The copy ends once the stream is past what its last chunk saw committed, which can come after the rows
        # are equal (seen once: a stop 0.2 s after the last chunk left the table copying, its copy complete).
        items = oid(db, "items")
        runner.wait_equal(lambda: TableStateKind.READY, lambda: table_states_in(state)[items], timeout=120)
    assert table_states_in(state)[items] is TableStateKind.READY  # and still so once the run stopped


def copied_rows_served(port: int, table: str) -> float:
    """``etl_copied_rows_total`` of ``table`` as a running ``etl run`` serves it: the rows this process copied."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    return sum(s.value for s in samples if s.name == "etl_copied_rows_total" and s.labels.get("table") == table)


def rows_in_lake_files(catalog: Path, table: str) -> int:
    """The rows of a lake table's live data files, as its SQLite catalog says, read without a lock the pipeline
    could wait on (its stored rows, deleted ones included: about what a copy wrote so far)."""
    try:
        with closing(sqlite3.connect(f"file:{catalog}?mode=ro", uri=True, timeout=5)) as con:
            row = con.execute(
                "SELECT coalesce(sum(f.record_count), 0) FROM ducklake_data_file f JOIN ducklake_table t"
                " ON t.table_id = f.table_id AND t.end_snapshot IS NULL"
                " WHERE t.table_name = ? AND f.end_snapshot IS NULL",
                (table,),
            ).fetchone()
    except sqlite3.OperationalError:  # not created yet
        return 0
    return int(row[0])


def table_states_in(state: Path) -> dict[int, TableStateKind]:
    store = SqliteStore(state, pipeline_id=1)
    try:
        return {t: s.kind for t, s in store.get_table_states().items()}
    finally:
        store.close()


def recorded_after(state: Path, table: int) -> tuple[str, ...]:
    """The last key a stopped run recorded as copied (each column's text form)."""
    store = SqliteStore(state, pipeline_id=1)
    try:
        progress = store.get_copy_progress(table)
    finally:
        store.close()
    assert progress is not None and progress.resume_after is not None
    after = ChunkMark.from_json(progress.resume_after)[0]
    assert after is not None
    return after


def oid(db: TestDatabase, table: str) -> int:
    return int(db.execute("SELECT %s::regclass::oid", (table,))[0][0])


# -- the source changing under a copy ----------------------------------------------------------------------------
# A commit streamed before it is visible, a swap of table names, a new primary key; a backfill whose predicate fails;
# a forgotten transaction that holds a copy back. Each pauses the copy after a few chunks (HeldChunks) to change the
# source at a known point.
SMALL = 3000
SMALL_CHUNK = 500


@pytest.fixture
def small(pg_database: TestDatabase) -> TestDatabase:
    pg_database.execute(
        f"""
        CREATE TABLE t (id bigint PRIMARY KEY, other int NOT NULL, v text);
        INSERT INTO t SELECT g, g + 100000, 'row ' || g FROM generate_series(1, {SMALL}) g;
        CREATE PUBLICATION pub FOR TABLE t;
        """
    )
    return pg_database


def start_small(db: TestDatabase, destination: HeldChunks, state: Path, **copy: Any) -> Pipeline:
    config = pipeline_config(db, copy={"method": "incremental", "chunk_rows": SMALL_CHUNK} | copy)
    pipeline = Pipeline(config, SqliteStore(state, pipeline_id=1), destination)
    pipeline.start()
    return pipeline


def held_after(destination: HeldChunks, chunks: int, pipeline: Pipeline) -> None:
    destination.hold_after = chunks
    wait_until(destination.held.is_set, f"{chunks} chunks written", pipeline)


@pytest.mark.alone  # a synchronous standby that never answers holds every commit of the cluster meanwhile
def test_a_commit_streamed_before_it_is_visible_is_not_lost(small: TestDatabase, tmp_path: Path) -> None:
    """An insert waits for a synchronous standby that never comes: its commit is in the WAL, and streamed, but not
    visible, and as the newest transaction it is at its snapshots' xmax (``731:731:``), in no ``xip``. The chunks
    read meanwhile are read again until it is visible, and the destination gets its row."""
    destination = HeldChunks()
    pipeline = start_small(small, destination, tmp_path / "state.sqlite")

    def insert() -> None:
        with small.connect(autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")  # test clusters commit with it off
            conn.execute(f"INSERT INTO t VALUES ({SMALL + 1}, 0, 'waited for the standby')")

    inserted = threading.Thread(target=insert)
    try:
        held_after(destination, 2, pipeline)
        with small.connect(autocommit=True) as sql, capture_logs() as logs:
            sql.execute("ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
            try:
                sql.execute("SELECT pg_reload_conf()")
                time.sleep(0.5)  # the checkpointer's turn: it tells backends a synchronous standby is named
                inserted.start()

                def waiting() -> bool:
                    rows = sql.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
                    return rows.fetchone() == (1,)

                wait_until(waiting, "the insert waiting for the standby", pipeline, timeout=10)
                time.sleep(1)  # streamed meanwhile: the walsender sends what is flushed
                destination.go.set()
                reread = "a chunk did not see a transaction already streamed; reading it again"
                wait_until(
                    lambda: any(e["event"] == reread for e in logs) or all_ready(pipeline, 1),
                    "a chunk read again",
                    pipeline,
                )
                assert not all_ready(pipeline, 1), "the copy ended while a streamed insert was not visible"
            finally:
                sql.execute("ALTER SYSTEM RESET synchronous_standby_names")
                sql.execute("SELECT pg_reload_conf()")
        inserted.join(timeout=30)
        wait_until(lambda: all_ready(pipeline, 1), "the copy done", pipeline)
        wait_until(lambda: destination_matches(small, destination, "public.t"), "equal to the source", pipeline)
    finally:
        destination.go.set()
        pipeline.shutdown()


def test_a_swap_of_names_during_a_copy_reads_the_table_by_its_oid(small: TestDatabase, tmp_path: Path) -> None:
    """``t`` and an unpublished ``t_new`` swap names between two chunks: the chunks after it read ``t_old``, the
    table the copy began with, and none of ``t_new``'s rows."""
    small.execute("CREATE TABLE t_new (LIKE t INCLUDING ALL); INSERT INTO t_new SELECT id, other, 'wrong' FROM t")
    destination = HeldChunks()
    pipeline = start_small(small, destination, tmp_path / "state.sqlite")
    try:
        held_after(destination, 2, pipeline)
        small.execute("BEGIN; ALTER TABLE t RENAME TO t_old; ALTER TABLE t_new RENAME TO t; COMMIT")
        destination.go.set()
        wait_until(lambda: all_ready(pipeline, 1), "the copy done", pipeline)
        small.execute("UPDATE t_old SET v = 'after the swap' WHERE id = 1")  # its new name comes with it
        wait_until(lambda: destination_matches(small, destination, "public.t_old"), "equal to t_old", pipeline)
    finally:
        destination.go.set()
        pipeline.shutdown()


def test_a_new_primary_key_during_a_copy_copies_the_table_again(small: TestDatabase, tmp_path: Path) -> None:
    """After three chunks (of keys up to 1500) the primary key moves to another column, and rows come that repeat
    ids of the old key: the copy starts again, by the new key, rather than go on by a column that is no longer
    unique (each chunk that ends inside a run of equal ids would leave the rest of the run out)."""
    destination = HeldChunks()
    state = tmp_path / "state.sqlite"
    pipeline = start_small(small, destination, state)
    try:
        held_after(destination, 2, pipeline)
        small.execute(
            "ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (other);"
            f" INSERT INTO t SELECT g, g + 200000, 'again' FROM generate_series(1, {SMALL}) g;"
            " INSERT INTO t VALUES (1501, 300000, 'thrice')"  # the next chunk (after 1500) ends inside a pair of ids
        )
        destination.hold_after = None
        destination.go.set()
        wait_until(lambda: all_ready(pipeline, 1), "the copy done", pipeline)
        wait_until(lambda: destination_matches(small, destination, "public.t"), "equal to the source", pipeline)
        assert destination.schema("public.t").key_columns[0].name == "other"
    finally:
        destination.go.set()
        pipeline.shutdown()


def test_a_new_primary_key_while_stopped_mid_copy_copies_the_table_again(small: TestDatabase, tmp_path: Path) -> None:
    """Stopped after three chunks (ids up to 1500), the table's primary key moves to ``other``, and rows come that
    repeat id 2000, where the next chunk ends: the next run finds the key it recorded with the copy's position
    changed and copies the table again by the new key, rather than go on by ids, no longer unique, whose chunk
    limit would cut the run of 2000s and leave two of them out."""
    destination = HeldChunks()
    state = tmp_path / "state.sqlite"
    first = start_small(small, destination, state)
    try:
        held_after(destination, 2, first)
        first.request_stop()
    finally:
        destination.go.set()
        first.shutdown()
    assert table_states_in(state)[oid(small, "t")] is TableStateKind.COPYING
    assert copied_rows(first, "public.t") < SMALL
    small.execute(
        "ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (other);"
        " INSERT INTO t VALUES (2000, 1, 'same id'), (2000, 2, 'same id')"
    )
    destination.hold_after = None
    second = start_small(small, destination, state)
    try:
        wait_until(lambda: all_ready(second, 1), "the copy done", second)
        wait_until(lambda: destination_matches(small, destination, "public.t"), "equal to the source", second)
        assert destination.schema("public.t").key_columns[0].name == "other"
        assert copied_rows(second, "public.t") == SMALL + 2, "the whole table, copied again"
    finally:
        second.shutdown()


def test_a_failed_backfill_is_dropped_and_its_table_streams_on(small: TestDatabase, tmp_path: Path) -> None:
    """A backfill whose predicate fails on some row (division by zero) is dropped: the table stays ready and
    streams on, and the log, ``etl status`` and ``etl_backfills_failed_total`` say why."""
    destination = HeldChunks()
    state = tmp_path / "state.sqlite"
    pipeline = start_small(small, destination, state)
    try:
        wait_until(lambda: all_ready(pipeline, 1), "the copy done", pipeline)
        asking = SqliteStore(state, pipeline_id=1)
        try:
            request_resync(pipeline.config, asking, TableName("public", "t"), "1 / (id - 1500) > -1")
        finally:
            asking.close()
        with capture_logs() as logs:
            failed = "a backfill failed and was dropped; the table streams on"
            wait_until(lambda: any(e["event"] == failed for e in logs), "the backfill failed", pipeline)
            wait_until(lambda: all_ready(pipeline, 1), "the table ready", pipeline)
        assert [e["log_level"] for e in logs if e["event"] == failed] == ["error"]
        small.execute("INSERT INTO t VALUES (-1, 0, 'after the backfill'); UPDATE t SET v = 'on' WHERE id = 2")
        wait_until(lambda: destination_matches(small, destination, "public.t"), "equal to the source", pipeline)
        registry = pipeline.metrics.registry
        assert registry.get_sample_value("etl_backfills_failed_total", {"table": "public.t"}) == 1
        reading = SqliteStore(state, pipeline_id=1)
        try:
            (table,) = status_report(pipeline.config, reading).tables
        finally:
            reading.close()
        assert table.state.kind is TableStateKind.READY and table.copy is not None
        assert "failed and was dropped" in table.to_json()["copy"]["note"]
        assert "division by zero" in table.to_json()["copy"]["note"]
    finally:
        pipeline.shutdown()


def test_a_copy_held_back_by_an_open_transaction_names_it(small: TestDatabase, tmp_path: Path) -> None:
    """A transaction that took an xid and stays open holds a copy taken on meanwhile at its first chunk: the log
    says so once, and ``etl status`` names its backend (and a backfill asked for meanwhile, ignored); once it ends,
    the copy goes on."""
    destination = HeldChunks()
    state = tmp_path / "state.sqlite"
    pipeline = start_small(small, destination, state)
    try:
        wait_until(lambda: all_ready(pipeline, 1), "the copy done", pipeline)
        with small.connect(autocommit=True) as idle, capture_logs() as logs:
            idle.execute("BEGIN")
            pid = idle.execute("SELECT pg_backend_pid()").fetchone()
            idle.execute("SELECT txid_current()")
            asking = SqliteStore(state, pipeline_id=1)
            try:
                request_resync(pipeline.config, asking, TableName("public", "t"))
            finally:
                asking.close()
            held = "an incremental copy waits for transactions open since it began"
            wait_until(lambda: any(e["event"] == held for e in logs), "the copy said what it waits for", pipeline)
            assert table_states(pipeline)[oid(small, "t")] is TableStateKind.COPYING
            assert copied_rows(pipeline, "public.t") == SMALL  # the first copy's only
            reading = SqliteStore(state, pipeline_id=1)
            try:
                (table,) = status_report(pipeline.config, reading).tables
            finally:
                reading.close()
            assert pid is not None and f"pid {pid[0]} (xid" in table.to_json()["copy"]["note"]
            # A backfill asked for meanwhile is ignored, and says so where the operator looks.
            asking = SqliteStore(state, pipeline_id=1)
            try:
                request_resync(pipeline.config, asking, TableName("public", "t"), "id < 10")
            finally:
                asking.close()
            ignored = "backfill asked for a table being copied, backfilled or errored; ignored"
            wait_until(lambda: any(e["event"] == ignored for e in logs), "the backfill ignored", pipeline)
            reading = SqliteStore(state, pipeline_id=1)
            try:
                (table,) = status_report(pipeline.config, reading).tables
            finally:
                reading.close()
            note = table.to_json()["copy"]["note"]
            assert "backfill of the rows where id < 10 was ignored: the table was being copied" in note, note
            idle.execute("ROLLBACK")
        wait_until(lambda: all_ready(pipeline, 1), "the copy done", pipeline)
        wait_until(lambda: destination_matches(small, destination, "public.t"), "equal to the source", pipeline)
        assert [e["event"] for e in logs].count(held) == 1
    finally:
        pipeline.shutdown()


SIDE_ROWS = 24_000
"""Rows of each of the three tables copied side by side: six chunks each, and more for the rows added meanwhile."""


class Timed:
    """Wraps a destination: which table each chunk it wrote was of, in order (batches of chunk rows, or staged
    chunks committed), and when each row of ``live`` became durable. ``after_chunk`` runs after each chunk's write,
    on the apply worker's thread."""

    def __init__(self, inner: Destination, live: int) -> None:
        self.inner, self.live = inner, live
        self.chunks: list[int] = []
        self.after_chunk: Callable[[list[int]], None] = lambda chunks: None
        self.durable: dict[int, float] = {}
        self._staged: dict[int, int] = {}
        if isinstance(inner, ChunkCopier):  # a copier only when the wrapped destination is one
            self.stage_chunk, self.commit_chunk = self._stage_chunk, self._commit_chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write_events(self, batch: EventBatch) -> WriteResult:
        result = self.inner.write_events(batch)
        assert result is WriteResult.DURABLE
        now = time.monotonic()
        for table_id, segments in batch.changes.items():
            for segment in segments:
                rows = segment.table
                if table_id == self.live:
                    for key in rows.column("id").to_pylist():
                        self.durable.setdefault(key, now)
                elif rows.num_rows and pc.min(rows.column("_etl_tx_ordinal")).as_py() >= CHUNK_ORDINAL_BASE:
                    self.chunks.append(table_id)
                    self.after_chunk(self.chunks)
        return result

    def _stage_chunk(self, plan: CopyPlan, watermark: tuple[Lsn, int], stop: threading.Event) -> StagedChunk:
        assert isinstance(self.inner, ChunkCopier)
        staged = self.inner.stage_chunk(plan, watermark, stop)
        self._staged[id(staged)] = plan.schema.id
        return staged

    def _commit_chunk(self, staged: StagedChunk) -> int:
        assert isinstance(self.inner, ChunkCopier)
        written = self.inner.commit_chunk(staged)
        self.chunks.append(self._staged.pop(id(staged)))
        self.after_chunk(self.chunks)
        return written


@pytest.mark.parametrize("into", ["memory", "ducklake"])
def test_three_tables_copy_side_by_side_while_a_fourth_streams(
    pg_database: TestDatabase, tmp_path: Path, into: str
) -> None:
    """Three tables copied incrementally at once (``table_sync_workers = 3``) while a fourth streams. Locked once
    each has a chunk written, the three tables' chunk reads wait on the source side by side, and the fourth table's
    changes become durable meanwhile: the apply worker reads no chunk. Once the lock is gone, chunks of the three
    tables come interleaved, under a workload on all four tables, and every table ends equal to the source row for
    row."""
    db = pg_database
    db.execute(
        "".join(
            f"CREATE TABLE {t} (id bigint PRIMARY KEY, v text);"
            f" INSERT INTO {t} SELECT g, '{t} ' || g FROM generate_series(1, {SIDE_ROWS}) g;"
            for t in "abc"
        )
        + "CREATE TABLE live (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE a, b, c, live; ANALYZE;"
    )
    sections: dict[str, Any] = {
        "pipeline": {"table_sync_workers": 3},
        "copy": {"method": "incremental", "chunk_rows": SIDE_ROWS // 6, "skip": ["live"]},
    }
    lake = {"type": "ducklake", "catalog": f"sqlite:///{tmp_path}/catalog.sqlite", "data_path": f"{tmp_path}/d/"}
    if into == "ducklake":
        # Chunks this small are staged on the driver, each in its copy thread. On Spark's executors a chunk's job
        # takes every core, so the reads of the other tables queue in Spark (the test_ducklake_copy_job tests).
        sections["destination"] = lake | {"spark": {"master": "local[2]"}}
    config = pipeline_config(db, **sections)
    store = SqliteStore(tmp_path / "state.sqlite", pipeline_id=1)
    memory = MemoryDestination()
    destination = Timed(build_destination(config, store, "test") if into == "ducklake" else memory, oid(db, "live"))
    pipeline = Pipeline(config, store, cast(Destination, destination))
    committed: dict[int, float] = {}

    def insert_live(conn: psycopg.Connection[Any], key: int) -> None:
        conn.execute("INSERT INTO live VALUES (%s)", (key,))
        committed[key] = time.monotonic()

    with db.connect() as locker, db.connect(autocommit=True) as sql:
        copied, locked = {oid(db, t) for t in "abc"}, threading.Event()

        def lock_once_each_began(chunks: list[int]) -> None:
            # Not before: the lock gives its transaction an xid, which a copy that begins after it waits for.
            if not locked.is_set() and set(chunks) >= copied:
                locker.execute("BEGIN")
                locker.execute("LOCK TABLE a, b, c IN ACCESS EXCLUSIVE MODE")
                locked.set()

        destination.after_chunk = lock_once_each_began
        waiting_reads = (
            "SELECT count(DISTINCT relation) FROM pg_catalog.pg_locks WHERE NOT granted"
            " AND relation = ANY (ARRAY['a', 'b', 'c']::pg_catalog.regclass[])"
        )
        pipeline.start()
        try:
            poll(
                lambda: sql.execute(waiting_reads).fetchone(),
                "a chunk read of each of the three tables waiting on the lock",
                until=lambda found: found == (3,),
                pipeline=pipeline,
                timeout=180,
            )
            written = list(destination.chunks)
            for key in range(1, 21):
                insert_live(sql, key)
            poll(
                lambda: set(destination.durable),
                "the fourth table's changes durable while three chunk reads wait",
                until=lambda keys: keys >= set(range(1, 21)),
                pipeline=pipeline,
            )
            assert sql.execute(waiting_reads).fetchone() == (3,), "the chunk reads still wait"
            assert destination.chunks == written, "no chunk written while every table's read waits"
        finally:
            if locked.is_set():
                locker.execute("ROLLBACK")
        key, stop = 20, threading.Event()

        def work() -> None:
            nonlocal key
            with db.connect(autocommit=True) as conn:
                while not stop.is_set():
                    key += 1
                    insert_live(conn, key)
                    table, row = "abc"[key % 3], key * 7 % SIDE_ROWS + 1
                    conn.execute(f"UPDATE {table} SET v = v || '+' WHERE id = %s", (row,))
                    conn.execute(f"INSERT INTO {table} VALUES (%s, 'new')", (SIDE_ROWS + key,))
                    time.sleep(0.02)

        worker = threading.Thread(target=work)
        worker.start()
        try:
            wait_until(lambda: all_ready(pipeline, 4), "every table ready", pipeline, timeout=240)
        finally:
            stop.set()
            worker.join()
        try:
            tables = ("public.a", "public.b", "public.c", "public.live")
            if into == "ducklake":

                def equal() -> bool:
                    with db.connect() as conn:
                        return all(lake_matches(conn, lake["catalog"], t) for t in tables)

            else:
                equal = partial(destination_matches, db, memory, *tables)
            wait_until(equal, "every table equal to the source", pipeline, timeout=120)
        finally:
            pipeline.shutdown()
    assert all(destination.chunks.count(oid(db, t)) >= 6 for t in "abc"), destination.chunks
    runs = 1 + sum(1 for x, y in zip(destination.chunks, destination.chunks[1:], strict=False) if x != y)
    assert runs >= 6, f"the chunks of the three tables interleaved: {destination.chunks}"
    # The live table's changes during the copy: durable at the pace of its batches (100 ms) and their writes, not
    # behind chunks; a bound far above that, and below a chunk read held back as above.
    lag = max(destination.durable[k] - committed[k] for k in committed)
    assert lag < 10, f"a change of the fourth table took {lag:.1f} s to become durable"
