"""A source that fails over to its standby, with the pipeline's `host` naming both servers.

Postgres 17+ keeps failover slots in step on a standby with `sync_replication_slots`: the pipeline goes on from
the promoted standby, with nothing lost and nothing copied again. Without a synced slot (Postgres 15, or the
setting off) the failover ends in the slot-lost path, and `etl check` on the new primary says the slot is missing.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from etl.checks import run_checks
from etl.config import PipelineConfig
from etl.destination.memory import MemoryDestination
from etl.factory import build_store
from etl.pipeline import Pipeline
from etl.postgres.slot_state import SlotLostError
from etl.schema import TableId
from etl.store.memory import MemoryStore
from etl.testing import TemporaryCluster, find_install
from etl.testing.pipelines import all_ready, destination_matches, pipeline_config, poll, wait_until
from etl.testing.pytest_plugin import TestDatabase

DATABASE = "app"
STANDBY_SLOT = "standby_1"


@dataclass
class Pair:
    primary: TestDatabase
    standby: TestDatabase

    def config(
        self, store: dict[str, object] | None = None, copy: dict[str, object] | None = None, **pipeline: object
    ) -> PipelineConfig:
        """A pipeline whose source names the primary, then the standby (libpq's multi-host form)."""
        ports = [self.primary.cluster.port, self.standby.cluster.port]
        sections: dict[str, Any] = {
            "batch": {"max_fill_ms": 200},
            "pipeline": pipeline,
            "source": {"host": "127.0.0.1,127.0.0.1", "port": ports},
        }
        if store is not None:
            sections["store"] = store
        if copy is not None:
            sections["copy"] = copy
        return pipeline_config(self.primary, **sections)

    def fail_over(self) -> None:
        """Promote the standby once it replayed everything the primary wrote; stop the primary."""
        lsn = self.primary.execute("SELECT pg_current_wal_lsn()::text")[0][0]
        poll(
            lambda: self.standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))[0][0] is True,
            "the standby to catch up",
            timeout=60,
            least=0.1,
        )
        self.primary.cluster.stop()
        self.standby.execute("SELECT pg_promote(wait => true)")


def make_pair(major: int, synced: bool) -> tuple[TemporaryCluster, TemporaryCluster]:
    primary = TemporaryCluster(find_install(major)).start()
    primary.create_database(DATABASE)
    with primary.connect(DATABASE) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, qty int NOT NULL, note text)")
        conn.execute("INSERT INTO items SELECT g, g % 7, 'n' || g FROM generate_series(1, 2000) g")
        conn.execute("CREATE PUBLICATION pub FOR TABLE items")
        conn.execute("SELECT pg_create_physical_replication_slot(%s)", (STANDBY_SLOT,))
    settings = {"primary_slot_name": STANDBY_SLOT}
    if synced:
        # The standby keeps the failover slots in step; its primary_conninfo names a database for that.
        settings |= {
            "sync_replication_slots": "on",
            # Not the primary's: promoted, it would wait for a standby of its own that does not exist.
            "synchronized_standby_slots": "",
            "primary_conninfo": f"host=127.0.0.1 port={primary.port} user=postgres dbname={DATABASE}",
        }
        # Logical changes reach the pipeline only once the standby has them: a promoted standby has all it was sent.
        primary.restart({"synchronized_standby_slots": STANDBY_SLOT})
    return primary, primary.start_standby(settings)


@pytest.fixture
def synced_pair() -> Iterator[Pair]:
    primary, standby = make_pair(18, synced=True)
    try:
        yield Pair(TestDatabase(primary, DATABASE), TestDatabase(standby, DATABASE))
    finally:
        standby.stop()
        primary.stop()


def copied_rows(pipeline: Pipeline, table: str = "public.items") -> float:
    value = pipeline.metrics.registry.get_sample_value("etl_copied_rows_total", {"table": table})
    return value or 0.0


def wait_synced(pair: Pair, pipeline: Pipeline) -> None:
    def synced() -> bool:
        rows = pair.standby.execute(
            "SELECT failover AND synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = 'etl_apply_1'"
        )
        return rows == [(True,)]

    # The slot-sync worker naps up to 30 s between rounds while nothing changes.
    wait_until(synced, "the apply slot synced to the standby", pipeline, timeout=180)


def oid(db: TestDatabase, table: str) -> TableId:
    return TableId(db.execute("SELECT %s::regclass::oid", (table,))[0][0])


@pytest.mark.slow
def test_a_failover_to_a_standby_with_synced_slots_goes_on_with_nothing_copied_again(synced_pair: Pair) -> None:
    pair = synced_pair
    destination = MemoryDestination()
    pipeline = Pipeline(pair.config(), MemoryStore(pipeline_id=1), destination)
    pipeline.start()
    try:
        wait_until(lambda: all_ready(pipeline, 1), "the copy", pipeline)
        pair.primary.execute("UPDATE items SET qty = qty + 1 WHERE id % 3 = 0; DELETE FROM items WHERE id % 50 = 0")
        wait_until(lambda: destination_matches(pair.primary, destination, "public.items"), "streamed", pipeline)
        copied = copied_rows(pipeline)
        assert copied == 2000

        wait_synced(pair, pipeline)
        pair.primary.execute("INSERT INTO items VALUES (5001, 1, 'before the failover')")
        pair.fail_over()
        new_primary = pair.standby
        new_primary.execute(
            "INSERT INTO items VALUES (5002, 2, 'after'); UPDATE items SET note = 'moved' WHERE id < 30"
        )
        wait_until(
            lambda: destination_matches(new_primary, destination, "public.items"),
            "streamed from the new primary",
            pipeline,
            timeout=120,
        )
        assert copied_rows(pipeline) == copied, "nothing was copied again"
        assert new_primary.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'etl_apply_1'") == [
            (True,)
        ]
    finally:
        pipeline.shutdown()


@pytest.mark.slow
def test_copies_read_ahead_of_a_lagging_standby_are_not_written_so_a_failover_leaves_no_phantoms(
    synced_pair: Pair,
) -> None:
    """The primary's walsenders send nothing its standby lacks; copies read the primary's tables, so they wait for
    the standby too. Here the standby receives nothing while the primary takes updates and inserts, and a backfill
    (chunks) and a copy (a snapshot: the table has no key) read them; the primary crashes, the standby is
    promoted: the destination holds the new primary's rows, none of the changes it never had."""
    pair = synced_pair
    pair.primary.execute(
        "CREATE TABLE notes (k text NOT NULL, v int NOT NULL); ALTER TABLE notes REPLICA IDENTITY FULL;"
        " INSERT INTO notes SELECT 'k' || g, g FROM generate_series(1, 300) g;"
        " ALTER PUBLICATION pub ADD TABLE notes"
    )
    destination = MemoryDestination()
    config = pair.config(copy={"method": "incremental", "chunk_rows": 300})
    pipeline = Pipeline(config, MemoryStore(pipeline_id=1), destination)
    pipeline.start()
    try:
        wait_until(lambda: all_ready(pipeline, 2), "the copies", pipeline)
        wait_synced(pair, pipeline)
        # The primary's walsender to the standby sends nothing more: what it had sent, the standby keeps.
        sender = pair.primary.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (STANDBY_SLOT,)
        )[0][0]
        os.kill(sender, signal.SIGSTOP)
        try:
            pair.primary.execute(
                "UPDATE items SET qty = qty + 100 WHERE id <= 1000;"
                " INSERT INTO items SELECT g, 1, 'never on the standby' FROM generate_series(3001, 3500) g;"
                " UPDATE notes SET v = -v"
            )
            with capture_logs() as logs:
                pipeline.resync(oid(pair.primary, "items"), where="id > 0")
                pipeline.resync(oid(pair.primary, "notes"))

                def held(table: str, event: str) -> bool:
                    return any(event in e["event"] and table in (e.get("table"), e.get("copy")) for e in logs)

                wait_until(
                    lambda: (
                        held("public.items", "a standby in synchronized_standby_slots lacks")
                        or copied_rows(pipeline, "public.items") == 2000 + 2500
                    ),  # every row of the primary backfilled
                    "a chunk held back by the standby",
                    pipeline,
                )
                wait_until(
                    lambda: (
                        held("public.notes", "a copy waits until the standbys")
                        or copied_rows(pipeline, "public.notes") == 2 * 300
                    ),  # copied twice
                    "a copy held back by the standby",
                    pipeline,
                )
        finally:
            os.kill(sender, signal.SIGKILL)  # with what it never sent
        pair.primary.cluster.crash()
        pair.standby.execute("SELECT pg_promote(wait => true)")
        new_primary = pair.standby
        new_primary.execute("INSERT INTO items VALUES (5002, 2, 'after'); INSERT INTO notes VALUES ('after', 1)")
        wait_until(lambda: all_ready(pipeline, 2), "the backfill and the copy, on the new primary", pipeline, 120)
        wait_until(
            lambda: destination_matches(new_primary, destination, "public.items", "public.notes"),
            "the new primary's rows, none of the lost ones",
            pipeline,
            timeout=120,
        )
    finally:
        pipeline.shutdown()


@pytest.mark.slow
def test_a_failover_without_a_synced_slot_stops_and_check_says_the_slot_is_missing(
    pg_major: int, tmp_path: Path
) -> None:
    primary, standby = make_pair(pg_major, synced=False)
    try:
        pair = Pair(TestDatabase(primary, DATABASE), TestDatabase(standby, DATABASE))
        config = pair.config(store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")}, failover_slots=False)
        destination = MemoryDestination()
        pipeline = Pipeline(config, build_store(config, "test"), destination)
        pipeline.start()
        wait_until(lambda: all_ready(pipeline, 1), "the copy", pipeline)
        pair.primary.execute("UPDATE items SET qty = 0 WHERE id < 10")
        wait_until(lambda: destination_matches(pair.primary, destination, "public.items"), "streamed", pipeline)
        pair.fail_over()
        with pytest.raises(SlotLostError, match="etl_apply_1 is gone") as error:
            pipeline.wait(timeout=120)
        assert "etl reset --recopy" in (error.value.hint or "")
        pipeline.shutdown()

        checks = {c.name: c for c in run_checks(config)}
        assert checks["source reachable"].ok, "the check reached the new primary"
        assert checks["apply slot"].failed
        assert "etl_apply_1 is gone" in checks["apply slot"].detail
        assert "etl reset --recopy" in (checks["apply slot"].fix or "")
    finally:
        standby.stop()
        primary.stop()


@pytest.mark.slow
def test_the_setting_turns_an_existing_apply_slot_into_a_failover_slot_and_back(
    synced_pair: Pair, tmp_path: Path
) -> None:
    pair = synced_pair

    def failover_is(wanted: bool) -> Callable[[], bool]:
        query = "SELECT failover FROM pg_replication_slots WHERE slot_name = 'etl_apply_1'"
        return lambda: pair.primary.execute(query) == [(wanted,)]

    for wanted in (False, True, False):
        config = pair.config(store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")}, failover_slots=wanted)
        pipeline = Pipeline(config, build_store(config, "test"), MemoryDestination())
        pipeline.start()
        try:
            wait_until(failover_is(wanted), f"the apply slot with failover = {wanted}", pipeline)
        finally:
            pipeline.shutdown()
