"""The store contract: tests every store must pass, for built-in and third-party stores alike.

Subclass the contract your store meets, name your store class and give one fixture, its config:

- ``StoreContract``: every store;
- ``DurableStoreContract``: the state outlives the process and a pipeline lock guards it;
- ``ConcurrentStoreContract``: durable, and several open instances of one pipeline write to the
  storage without undoing each other's writes (stores that write row by row, like the SQL stores).

::

    from etl.testing.store_contract import DurableStoreContract

    class TestMyStore(DurableStoreContract):
        store_class = MyStore

        @pytest.fixture
        def store_config(self, tmp_path):
            return {"path": str(tmp_path / "state")}

The tests open stores the way ``etl run`` does (``Config`` then ``from_config``) through the
``make_store(pipeline_id=1)`` factory fixture; every store it opens with the same config shares the
same backing storage, and all are closed after the test. The lock test starts a real subprocess that
builds the store from the same config (passed as JSON on stdin), so the config must be
JSON-serialisable.
"""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar

import pydantic
import pytest

from etl.errors import PipelineLockedError, StoreError
from etl.lsn import Lsn
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl.store.base import (
    APPLY_WORKER,
    CopyProgress,
    DestinationSchemaStatus,
    DestinationTableMetadata,
    RetryKind,
    Store,
    TableActivity,
    TableState,
    TableStateKind,
    table_sync_worker,
)

MakeStore = Callable[..., Store]
"""``make_store(pipeline_id: int = 1) -> Store``."""

T1, T2, T3 = 16384, 16390, 4_294_967_295  # table ids (relation OIDs; the last is the largest OID)


def make_schema(table_id: int, lsn: int, *, columns: int = 2, name: str = "items") -> TableSchema:
    """A schema version whose every field differs from its default."""
    cols = [
        ColumnSchema(
            "id",
            20,
            -1,
            nullable=False,
            primary_key=True,
            type_name="bigint",
            attnum=1,
            default="nextval('s'::regclass)",
        )
    ]
    cols += [
        ColumnSchema(
            f"c{i}",
            1043,
            68,
            nullable=bool(i % 2),
            primary_key=False,
            type_name="character varying(64)",
            attnum=i + 2,
            default=f"'d{i}'::character varying" if i % 2 else None,
        )
        for i in range(1, columns)
    ]
    return TableSchema(table_id, TableName("sales", f"{name}_{table_id}"), tuple(cols), ReplicaIdentity.FULL, Lsn(lsn))


def sample_states() -> dict[int, TableState]:
    """One state of each shape: plain, with an LSN, errored with every field."""
    return {
        T1: TableState(TableStateKind.DATA_SYNC),
        T2: TableState(TableStateKind.SYNC_DONE, Lsn(0xFFFF_FFFF_0000_0001)),
        T3: TableState.errored(
            "value out of range in column c1",
            hint="widen the column, then run `etl resync`",
            retry=RetryKind.TIMED,
            retry_at=datetime(2030, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2))),
        ),
    }


def sample_metadata() -> DestinationTableMetadata:
    return DestinationTableMetadata(
        "sales_items",
        Lsn(0x1_0000_0000),
        DestinationSchemaStatus.APPLYING,
        {"columns": {"id": 1, "c1": 2}, "files": ["a.parquet", "b.parquet"], "ratio": 0.5, "note": "ü", "none": None},
    )


RESUME_AFTER = '{"after": 9223372036854775807, "position": "FFFFFFFF/FFFFFFFE", "ordinal": 1099511627776}'
"""An incremental copy's position (JSON text; the store keeps it as given)."""


def sample_copy_progress(rows: int = 1234, *, finished: bool = False) -> CopyProgress:
    """A copy's progress with times in a zone other than UTC (stores give them back in UTC), and an incremental
    copy's position."""
    started = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=-5)))
    recorded = started + timedelta(seconds=61, microseconds=5)
    return CopyProgress(rows, 2**40 + 7, started, recorded, finished, RESUME_AFTER)


def sample_activity(inserts: int = 5, *, truncates: int = 0) -> TableActivity:
    """A table's activity with times in a zone other than UTC (stores give them back in UTC)."""
    since = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=2)))
    return TableActivity(inserts, 2**40, 0, truncates, since, since + timedelta(minutes=5, microseconds=3))


class StoreContract:
    """Behaviour every store has, durable or not."""

    store_class: ClassVar[type[Any]]
    """The store plugin class (with ``name``, ``Config`` and ``from_config``)."""

    @pytest.fixture
    def store_config(self) -> dict[str, Any]:
        raise NotImplementedError(f"{type(self).__name__} must define a `store_config` fixture returning the options")

    @pytest.fixture
    def make_store(self, store_config: dict[str, Any]) -> Iterator[MakeStore]:
        opened: list[Store] = []

        def make(pipeline_id: int = 1) -> Store:
            config = self.store_class.Config.model_validate(store_config)
            store: Store = self.store_class.from_config(config, pipeline_id)
            opened.append(store)
            return store

        yield make
        for store in reversed(opened):
            store.close()

    @pytest.fixture
    def store(self, make_store: MakeStore) -> Store:
        return make_store()

    # -- the plugin ----------------------------------------------------------------------------------
    def test_plugin_surface(self, store_config: dict[str, Any], store: Store) -> None:
        cls = self.store_class
        assert isinstance(cls.name, str) and cls.name
        assert isinstance(store, Store)
        with pytest.raises(pydantic.ValidationError, match="no_such_option"):
            cls.Config.model_validate({**store_config, "no_such_option": 1})

    def test_new_store_is_empty(self, store: Store) -> None:
        assert store.get_table_states() == {}
        assert store.get_table_state(T1) is None
        assert store.get_table_schemas() == []
        assert store.get_table_schema(T1) is None
        assert store.get_progress(APPLY_WORKER) is None
        assert store.get_destination_metadata(T1) is None
        assert store.get_copy_progress(T1) is None
        assert store.get_table_activity() == {}

    # -- table states ------------------------------------------------------------------------------
    def test_update_table_states_keeps_every_field(self, store: Store) -> None:
        states = sample_states()
        store.update_table_states(states)
        assert store.get_table_states() == states
        for table_id, state in states.items():
            assert store.get_table_state(table_id) == state
        errored = store.get_table_state(T3)
        assert errored is not None and errored.retry_at is not None
        assert errored.retry_at == datetime(2030, 5, 6, 5, 8, 9, 123456, tzinfo=UTC)
        assert errored.retry_at.utcoffset() == timedelta(0)

    def test_update_only_touches_named_tables(self, store: Store) -> None:
        store.update_table_states(sample_states())
        store.update_table_states({T1: TableState(TableStateKind.FINISHED_COPY)})
        assert store.get_table_states() == {**sample_states(), T1: TableState(TableStateKind.FINISHED_COPY)}

    def test_memory_only_states_are_refused_and_nothing_changes(self, store: Store) -> None:
        store.update_table_states({T1: TableState.init()})
        for kind in (TableStateKind.SYNC_WAIT, TableStateKind.CATCHUP):
            with pytest.raises(ValueError, match=kind.value):
                store.update_table_states({T2: TableState.init(), T1: TableState(kind, Lsn(5))})
        assert store.get_table_states() == {T1: TableState.init()}

    def test_rollback_walks_back_through_history(self, store: Store) -> None:
        steps = [
            TableState.init(),
            TableState(TableStateKind.DATA_SYNC),
            TableState(TableStateKind.SYNC_DONE, Lsn(300)),
            TableState.errored("boom", hint="fix it"),
        ]
        for state in steps:
            store.update_table_states({T1: state, T2: TableState(TableStateKind.READY)})
        assert store.rollback_table_state(T1) == steps[2]
        assert store.get_table_state(T1) == steps[2]
        assert store.rollback_table_state(T1) == steps[1]
        assert store.rollback_table_state(T1) == steps[0]
        assert store.get_table_state(T2) == TableState(TableStateKind.READY)
        store.update_table_states({T1: TableState(TableStateKind.READY)})
        assert store.rollback_table_state(T1) == steps[0]

    def test_rollback_without_previous_state_fails(self, store: Store) -> None:
        with pytest.raises(StoreError, match=str(T1)):
            store.rollback_table_state(T1)
        store.update_table_states({T1: TableState.init()})
        with pytest.raises(StoreError, match=str(T1)):
            store.rollback_table_state(T1)
        assert store.get_table_state(T1) == TableState.init()

    # -- schemas -----------------------------------------------------------------------------------
    def test_schema_lookup_takes_newest_version_at_or_before(self, store: Store) -> None:
        v10, v20, v30 = (make_schema(T1, lsn, columns=n) for n, lsn in ((2, 10), (3, 20), (4, 30)))
        for schema in (v20, v30, v10):
            store.store_table_schema(schema)
        store.store_table_schema(make_schema(T2, 15))
        assert store.get_table_schema(T1, Lsn(9)) is None
        assert store.get_table_schema(T1, Lsn(10)) == v10
        assert store.get_table_schema(T1, Lsn(19)) == v10
        assert store.get_table_schema(T1, Lsn(20)) == v20
        assert store.get_table_schema(T1, Lsn(29)) == v20
        assert store.get_table_schema(T1) == v30
        assert store.get_table_schema(T1, Lsn.MAX) == v30
        assert store.get_table_schema(T3) is None
        assert sorted(store.get_table_schemas(), key=lambda s: (s.id, s.snapshot_lsn)) == [
            v10,
            v20,
            v30,
            make_schema(T2, 15),
        ]

    def test_storing_a_schema_version_again_replaces_it(self, store: Store) -> None:
        store.store_table_schema(make_schema(T1, 10, columns=2))
        store.store_table_schema(make_schema(T1, 10, columns=5))
        assert store.get_table_schemas() == [make_schema(T1, 10, columns=5)]

    def test_schema_at_the_extremes_of_the_lsn_range(self, store: Store) -> None:
        store.store_table_schema(make_schema(T3, 0))
        store.store_table_schema(make_schema(T3, Lsn.MAX, columns=3))
        assert store.get_table_schema(T3, Lsn(Lsn.MAX - 1)) == make_schema(T3, 0)
        assert store.get_table_schema(T3) == make_schema(T3, Lsn.MAX, columns=3)

    def test_prune_keeps_the_boundary_version_and_newer(self, store: Store) -> None:
        for lsn in (10, 20, 30, 40):
            store.store_table_schema(make_schema(T1, lsn))
        for lsn in (50, 60):
            store.store_table_schema(make_schema(T2, lsn))
        store.store_table_schema(make_schema(T3, 5))
        # T1: 20 is in force at 25, so 10 goes. T2: nothing at or before 40, nothing goes. T3: not named.
        assert store.prune_table_schemas({T1: Lsn(25), T2: Lsn(40)}) == 1
        assert [s.snapshot_lsn for s in store.get_table_schemas() if s.id == T1] == [20, 30, 40]
        assert store.get_table_schema(T1, Lsn(25)) == make_schema(T1, 20)
        assert store.prune_table_schemas({T1: Lsn(40), T2: Lsn(60), T3: Lsn(5)}) == 3
        assert sorted((s.id, s.snapshot_lsn) for s in store.get_table_schemas()) == [(T1, 40), (T2, 60), (T3, 5)]
        assert store.prune_table_schemas({T1: Lsn.MAX}) == 0

    # -- progress ----------------------------------------------------------------------------------
    def test_progress_never_moves_backwards(self, store: Store) -> None:
        assert store.upsert_progress(APPLY_WORKER, Lsn(100)) == 100
        assert store.upsert_progress(APPLY_WORKER, Lsn(50)) == 100
        assert store.get_progress(APPLY_WORKER) == 100
        assert store.upsert_progress(APPLY_WORKER, Lsn(101)) == 101
        assert store.get_progress(APPLY_WORKER) == 101

    def test_progress_orders_the_full_unsigned_range(self, store: Store) -> None:
        below, above = Lsn(2**63 - 1), Lsn(2**63)  # a signed 64-bit integer would wrap between these two
        assert store.upsert_progress(APPLY_WORKER, below) == below
        assert store.upsert_progress(APPLY_WORKER, above) == above
        assert store.upsert_progress(APPLY_WORKER, below) == above
        assert store.upsert_progress(APPLY_WORKER, Lsn(0x0000_0010_FFFF_FFFF)) == above
        assert store.upsert_progress(APPLY_WORKER, Lsn.MAX) == Lsn.MAX
        stored = store.get_progress(APPLY_WORKER)
        assert stored == Lsn.MAX and isinstance(stored, Lsn)

    def test_progress_is_per_worker_and_deletable(self, store: Store) -> None:
        store.upsert_progress(APPLY_WORKER, Lsn(10))
        store.upsert_progress(table_sync_worker(T1), Lsn(20))
        assert store.get_progress(table_sync_worker(T1)) == 20
        store.delete_progress(APPLY_WORKER)
        store.delete_progress("never-stored")
        assert store.get_progress(APPLY_WORKER) is None
        assert store.get_progress(table_sync_worker(T1)) == 20
        assert store.upsert_progress(APPLY_WORKER, Lsn(5)) == 5  # deleted progress starts over

    def test_bad_lsns_are_refused(self, store: Store) -> None:
        for bad in (-1, 2**64):
            with pytest.raises(ValueError):
                store.upsert_progress(APPLY_WORKER, Lsn(bad))
        assert store.get_progress(APPLY_WORKER) is None

    # -- destination metadata ------------------------------------------------------------------------
    def test_destination_metadata_round_trip_and_replace(self, store: Store) -> None:
        store.store_destination_metadata(T1, sample_metadata())
        assert store.get_destination_metadata(T1) == sample_metadata()
        assert store.get_destination_metadata(T2) is None
        replaced = DestinationTableMetadata("sales_items_v2", Lsn(7))
        store.store_destination_metadata(T1, replaced)
        assert store.get_destination_metadata(T1) == replaced

    def test_destination_metadata_extra_must_be_json(self, store: Store) -> None:
        with pytest.raises(ValueError, match="JSON"):
            store.store_destination_metadata(T1, DestinationTableMetadata("t", Lsn(1), extra={"when": datetime.now()}))
        assert store.get_destination_metadata(T1) is None

    # -- copy progress -------------------------------------------------------------------------------
    def test_copy_progress_round_trip_and_replace(self, store: Store) -> None:
        started = sample_copy_progress(0)
        store.record_copy_progress(T1, started)
        got = store.get_copy_progress(T1)
        assert got == started
        assert got is not None and got.started_at.utcoffset() == got.recorded_at.utcoffset() == timedelta(0)
        assert got.started_at == datetime(2030, 1, 2, 8, 4, 5, 678901, tzinfo=UTC)
        assert store.get_copy_progress(T2) is None
        done = sample_copy_progress(2**63 - 1, finished=True)
        store.record_copy_progress(T1, done)
        assert store.get_copy_progress(T1) == done
        unanalyzed = CopyProgress(5, None, done.started_at, done.recorded_at)
        store.record_copy_progress(T3, unanalyzed)
        assert store.get_copy_progress(T3) == unanalyzed
        assert store.get_copy_progress(T1) == done

    def test_bad_copy_progress_is_refused_and_nothing_changes(self, store: Store) -> None:
        good = sample_copy_progress()
        store.record_copy_progress(T1, good)
        naive = datetime(2030, 1, 2, 3, 4, 5)
        for bad in (
            CopyProgress(-1, None, good.started_at, good.recorded_at),
            CopyProgress(1, -1, good.started_at, good.recorded_at),
            CopyProgress(2**63, None, good.started_at, good.recorded_at),
            CopyProgress(1, None, naive, good.recorded_at),
            CopyProgress(1, None, good.started_at, naive),
        ):
            with pytest.raises(ValueError, match="copy progress"):
                store.record_copy_progress(T1, bad)
        with pytest.raises(TypeError):
            store.record_copy_progress(T1, {"rows": 1})  # type: ignore[arg-type]
        assert store.get_copy_progress(T1) == good

    def test_table_activity_round_trip_replaces_only_the_tables_named(self, store: Store) -> None:
        store.record_table_activity({T1: sample_activity(1), T2: sample_activity(2)})
        assert store.get_table_activity() == {T1: sample_activity(1), T2: sample_activity(2)}
        assert store.get_table_activity()[T1].since.tzinfo == UTC
        store.record_table_activity({T1: sample_activity(2**63 - 1, truncates=3)})
        assert store.get_table_activity() == {T1: sample_activity(2**63 - 1, truncates=3), T2: sample_activity(2)}
        store.record_table_activity({})
        assert len(store.get_table_activity()) == 2

    def test_bad_table_activity_is_refused_and_nothing_changes(self, store: Store) -> None:
        good = sample_activity()
        store.record_table_activity({T1: good})
        naive = datetime(2030, 1, 2, 3, 4, 5)
        for bad in (
            replace(good, inserts=-1),
            replace(good, deletes=2**63),
            replace(good, truncates=True),
            replace(good, since=naive),
            replace(good, last_write_at=naive),
        ):
            with pytest.raises(ValueError, match="table activity"):
                store.record_table_activity({T2: good, T1: bad})
        with pytest.raises(ValueError, match="table id"):
            store.record_table_activity({-1: good})
        with pytest.raises(TypeError):
            store.record_table_activity({T1: {"inserts": 1}})  # type: ignore[dict-item]
        assert store.get_table_activity() == {T1: good}

    # -- lifecycle operations ------------------------------------------------------------------------
    def _populate(self, store: Store) -> None:
        store.update_table_states(sample_states())
        for table_id in (T1, T2):
            store.store_table_schema(make_schema(table_id, 10))
            store.store_table_schema(make_schema(table_id, 20, columns=3))
            store.store_destination_metadata(table_id, sample_metadata())
            store.upsert_progress(table_sync_worker(table_id), Lsn(table_id))
            store.record_copy_progress(table_id, sample_copy_progress(table_id, finished=True))
            store.record_table_activity({table_id: sample_activity(table_id)})
        store.upsert_progress(APPLY_WORKER, Lsn(99))

    def test_prepare_table_for_copy_keeps_only_the_state(self, store: Store) -> None:
        self._populate(store)
        store.prepare_table_for_copy(T1)
        assert store.get_table_state(T1) == sample_states()[T1]
        assert store.get_table_schema(T1) is None
        assert store.get_destination_metadata(T1) is None
        assert store.get_progress(table_sync_worker(T1)) is None
        assert store.get_copy_progress(T1) is None
        # Other tables and the apply worker are untouched.
        assert store.get_copy_progress(T2) == sample_copy_progress(T2, finished=True)
        assert store.get_table_schema(T2) == make_schema(T2, 20, columns=3)
        assert store.get_destination_metadata(T2) == sample_metadata()
        assert store.get_progress(table_sync_worker(T2)) == T2
        assert store.get_progress(APPLY_WORKER) == 99

    def test_reset_tables_for_resync(self, store: Store) -> None:
        self._populate(store)
        assert store.reset_tables_for_resync() == 3
        assert store.get_table_states() == {t: TableState.init() for t in (T1, T2, T3)}
        assert store.get_progress(APPLY_WORKER) is None
        # Kept: schemas, destination metadata, table sync progress and copy progress.
        assert store.get_table_schema(T1) == make_schema(T1, 20, columns=3)
        assert store.get_destination_metadata(T2) == sample_metadata()
        assert store.get_progress(table_sync_worker(T1)) == T1
        assert store.get_copy_progress(T1) == sample_copy_progress(T1, finished=True)

    def test_delete_table_state_forgets_the_table(self, store: Store) -> None:
        self._populate(store)
        store.delete_table_state(T1)
        assert T1 not in store.get_table_states()
        assert store.get_table_state(T1) is None
        assert store.get_table_schema(T1) is None
        assert store.get_destination_metadata(T1) is None
        assert store.get_progress(table_sync_worker(T1)) is None
        assert store.get_copy_progress(T1) is None
        assert store.get_table_activity() == {T2: sample_activity(T2)}
        with pytest.raises(StoreError):
            store.rollback_table_state(T1)
        assert store.get_table_state(T2) == sample_states()[T2]
        assert store.get_copy_progress(T2) == sample_copy_progress(T2, finished=True)
        assert store.get_progress(APPLY_WORKER) == 99

    # -- scoping, threads, closing --------------------------------------------------------------------
    def test_pipelines_are_isolated(self, make_store: MakeStore) -> None:
        first, second = make_store(1), make_store(2)
        self._populate(first)
        assert second.get_table_states() == {}
        assert second.get_table_schemas() == []
        assert second.get_progress(APPLY_WORKER) is None
        second.update_table_states({T1: TableState(TableStateKind.READY)})
        assert second.upsert_progress(APPLY_WORKER, Lsn(1)) == 1
        assert second.reset_tables_for_resync() == 1
        assert first.get_table_state(T1) == sample_states()[T1]
        assert first.get_progress(APPLY_WORKER) == 99

    def test_concurrent_writes_from_threads(self, store: Store) -> None:
        threads, rounds = 4, 15
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(rounds):
                    store.upsert_progress(APPLY_WORKER, Lsn(i * threads + n))
                    store.update_table_states({T1 + n: TableState(TableStateKind.SYNC_DONE, Lsn(i))})
                    store.store_table_schema(make_schema(T1 + n, i))
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert errors == []
        assert store.get_progress(APPLY_WORKER) == (rounds - 1) * threads + threads - 1
        assert store.get_table_states() == {
            T1 + n: TableState(TableStateKind.SYNC_DONE, Lsn(rounds - 1)) for n in range(threads)
        }
        assert len(store.get_table_schemas()) == threads * rounds
        assert store.rollback_table_state(T1) == TableState(TableStateKind.SYNC_DONE, Lsn(rounds - 2))

    def test_close_is_idempotent_and_later_writes_fail(self, store: Store) -> None:
        store.update_table_states({T1: TableState.init()})
        store.close()
        store.close()
        with pytest.raises(StoreError, match="closed"):
            store.update_table_states({T1: TableState(TableStateKind.DATA_SYNC)})
        with pytest.raises(StoreError, match="closed"):
            store.upsert_progress(APPLY_WORKER, Lsn(1))

    def test_lock_is_held_until_close(self, make_store: MakeStore) -> None:
        first = make_store(1)
        first.acquire_lock()
        first.acquire_lock()  # the holder may ask again
        first.update_table_states({T1: TableState.init()})
        first.close()
        second = make_store(1)
        second.acquire_lock()
        second.update_table_states({T1: TableState(TableStateKind.DATA_SYNC)})


_HOLDER_SCRIPT = """
import importlib, json, sys
module, _, qualname = sys.argv[1].partition(":")
cls = importlib.import_module(module)
for part in qualname.split("."):
    cls = getattr(cls, part)
store = cls.from_config(cls.Config.model_validate(json.loads(sys.stdin.readline())), int(sys.argv[2]))
store.acquire_lock()
print("LOCKED", flush=True)
sys.stdin.read()
"""


class DurableStoreContract(StoreContract):
    """Behaviour of stores whose state outlives the process: durability and the pipeline lock."""

    lock_release_timeout: ClassVar[float] = 15.0
    """How long the lock may take to be released after its holder is killed (a server must notice)."""

    def test_reopen_sees_everything(self, make_store: MakeStore) -> None:
        store = make_store()
        history = [TableState.init(), TableState(TableStateKind.DATA_SYNC), TableState(TableStateKind.FINISHED_COPY)]
        for state in history:
            store.update_table_states({T1: state})
        store.update_table_states({T2: sample_states()[T2], T3: sample_states()[T3]})
        for lsn in (10, 20):
            store.store_table_schema(make_schema(T1, lsn, columns=lsn // 10 + 1))
        store.store_table_schema(
            replace(
                make_schema(T3, Lsn.MAX),
                partitions=(16385, 2**32 - 1),
                attachments=((16385, 2**32 - 1), (16390, 745)),
            )
        )
        store.upsert_progress(APPLY_WORKER, Lsn(2**63))
        store.upsert_progress(table_sync_worker(T1), Lsn(7))
        store.store_destination_metadata(T1, sample_metadata())
        store.record_copy_progress(T1, sample_copy_progress(0))
        store.record_copy_progress(T1, sample_copy_progress(10**12, finished=True))
        store.record_copy_progress(T2, CopyProgress(0, None, sample_copy_progress().started_at, datetime.now(UTC)))
        store.record_table_activity({T1: sample_activity(1), T2: sample_activity(2)})
        store.record_table_activity({T1: sample_activity(10**12, truncates=1)})
        store.close()

        reopened = make_store()
        assert reopened.get_table_states() == {T1: history[-1], T2: sample_states()[T2], T3: sample_states()[T3]}
        assert reopened.get_table_schemas() == store.get_table_schemas()
        assert reopened.get_table_schema(T1, Lsn(15)) == make_schema(T1, 10, columns=2)
        t3 = reopened.get_table_schema(T3)
        assert t3 is not None and t3.partitions == (16385, 2**32 - 1), "the leaves a copy read (OIDs are unsigned)"
        assert t3.attachments == ((16385, 2**32 - 1), (16390, 745)), "when its partitions were attached"
        assert reopened.get_progress(APPLY_WORKER) == 2**63
        assert reopened.get_progress(table_sync_worker(T1)) == 7
        assert reopened.get_destination_metadata(T1) == sample_metadata()
        assert reopened.get_copy_progress(T1) == sample_copy_progress(10**12, finished=True)
        assert reopened.get_copy_progress(T2) == store.get_copy_progress(T2)
        assert reopened.get_copy_progress(T3) is None
        assert reopened.get_table_activity() == {T1: sample_activity(10**12, truncates=1), T2: sample_activity(2)}
        assert reopened.rollback_table_state(T1) == history[1]  # history is durable too
        reopened.close()
        assert make_store().get_table_state(T1) == history[1]

    def test_reopen_after_removals(self, make_store: MakeStore) -> None:
        store = make_store()
        self._populate(store)
        store.store_table_schema(make_schema(T2, 30))
        store.prune_table_schemas({T2: Lsn(25)})
        store.prepare_table_for_copy(T1)
        store.delete_progress(table_sync_worker(T2))
        store.reset_tables_for_resync()
        store.delete_table_state(T3)
        expected = (
            store.get_table_states(),
            store.get_table_schemas(),
            store.get_destination_metadata(T1),
            store.get_destination_metadata(T2),
            [store.get_progress(w) for w in (APPLY_WORKER, table_sync_worker(T1), table_sync_worker(T2))],
            [store.get_copy_progress(t) for t in (T1, T2, T3)],
        )
        store.close()
        reopened = make_store()
        assert (
            reopened.get_table_states(),
            reopened.get_table_schemas(),
            reopened.get_destination_metadata(T1),
            reopened.get_destination_metadata(T2),
            [reopened.get_progress(w) for w in (APPLY_WORKER, table_sync_worker(T1), table_sync_worker(T2))],
            [reopened.get_copy_progress(t) for t in (T1, T2, T3)],
        ) == expected
        assert expected[0] == {T1: TableState.init(), T2: TableState.init()}
        assert [s.snapshot_lsn for s in expected[1]] == [20, 30]
        assert expected[5] == [None, sample_copy_progress(T2, finished=True), None]
        assert reopened.rollback_table_state(T2) == sample_states()[T2]

    def test_pipelines_share_storage_durably(self, make_store: MakeStore) -> None:
        one, two = make_store(1), make_store(2)
        one.update_table_states({T1: TableState(TableStateKind.READY)})
        two.update_table_states({T1: TableState.errored("two's problem")})
        one.upsert_progress(APPLY_WORKER, Lsn(1))
        two.upsert_progress(APPLY_WORKER, Lsn(2))
        one.close()
        two.close()
        assert make_store(1).get_table_states() == {T1: TableState(TableStateKind.READY)}
        assert make_store(2).get_progress(APPLY_WORKER) == 2

    def test_copy_progress_reaches_a_reader_opened_later(self, make_store: MakeStore) -> None:
        """``etl status`` opens its own instance next to the running pipeline's and sees the copy's progress."""
        running = make_store()
        running.acquire_lock()
        running.update_table_states({T1: TableState(TableStateKind.DATA_SYNC)})
        running.record_copy_progress(T1, sample_copy_progress(10))
        assert make_store().get_copy_progress(T1) == sample_copy_progress(10)
        running.record_copy_progress(T1, sample_copy_progress(20))
        running.record_copy_progress(T2, sample_copy_progress(5, finished=True))
        reader = make_store()
        assert (reader.get_copy_progress(T1), reader.get_copy_progress(T2)) == (
            sample_copy_progress(20),
            sample_copy_progress(5, finished=True),
        )
        running.prepare_table_for_copy(T1)
        assert make_store().get_copy_progress(T1) is None

    def test_second_holder_of_the_lock_fails_fast(self, make_store: MakeStore) -> None:
        holder, other, other_pipeline = make_store(7), make_store(7), make_store(8)
        holder.acquire_lock()
        started = time.monotonic()
        with pytest.raises(PipelineLockedError) as caught:
            other.acquire_lock()
        assert time.monotonic() - started < 5
        assert "pipeline 7" in caught.value.message
        assert caught.value.hint and "stop it first" in caught.value.hint
        other_pipeline.acquire_lock()  # another pipeline id is another lock
        holder.close()
        other.acquire_lock()

    def test_a_closed_store_takes_no_lock(self, make_store: MakeStore) -> None:
        """A store once closed (by its owner, or by a failed read under the lock) refuses the lock: one it took
        then would never be let go, and no later run could take it."""
        closed = make_store(7)
        closed.close()
        with pytest.raises(StoreError, match="closed"):
            closed.acquire_lock()
        make_store(7).acquire_lock()

    def test_the_next_lock_holder_goes_on_from_the_last_state(self, make_store: MakeStore) -> None:
        """A store opened while another held the lock reads the state again once it takes the lock: the holder
        may have written until it let go (``etl run`` started while the previous one was stopping)."""
        first = make_store()
        first.acquire_lock()
        first.update_table_states({T1: TableState(TableStateKind.READY), T2: TableState(TableStateKind.DATA_SYNC)})
        first.upsert_progress(APPLY_WORKER, Lsn(10))
        second = make_store()
        with pytest.raises(PipelineLockedError):
            second.acquire_lock()
        first.upsert_progress(APPLY_WORKER, Lsn(20))
        first.update_table_states({T1: TableState(TableStateKind.SYNC_DONE, lsn=Lsn(15))})
        first.store_table_schema(make_schema(T1, 12))
        first.record_copy_progress(T1, sample_copy_progress(30, finished=True))
        first.delete_table_state(T2)
        first.close()
        second.acquire_lock()
        assert second.get_progress(APPLY_WORKER) == 20
        assert second.get_table_states() == {T1: TableState(TableStateKind.SYNC_DONE, lsn=Lsn(15))}
        assert second.get_table_schema(T1) == make_schema(T1, 12)
        assert second.get_copy_progress(T1) == sample_copy_progress(30, finished=True)
        second.update_table_states({T3: TableState.init()})
        second.close()
        assert make_store().get_table_states() == {
            T1: TableState(TableStateKind.SYNC_DONE, lsn=Lsn(15)),
            T3: TableState.init(),
        }

    def test_lock_is_released_when_the_holder_is_killed(
        self, store_config: dict[str, Any], make_store: MakeStore
    ) -> None:
        make_store(9).close()  # create the storage before two processes race to
        holder = _start_holder(self.store_class, store_config, 9)
        try:
            contender = make_store(9)
            with pytest.raises(PipelineLockedError, match="pipeline 9"):
                contender.acquire_lock()
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(timeout=30)
            deadline = time.monotonic() + self.lock_release_timeout
            while True:
                try:
                    contender.acquire_lock()
                    break
                except PipelineLockedError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            contender.update_table_states({T1: TableState.init()})
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            for pipe in (holder.stdin, holder.stdout, holder.stderr):
                if pipe is not None:
                    pipe.close()


class ConcurrentStoreContract(DurableStoreContract):
    """Stores whose instances change the storage row by row (SQL stores): several instances of one
    pipeline, as ``etl status`` next to ``etl run``, never undo each other's writes."""

    def test_progress_is_monotonic_in_storage(self, make_store: MakeStore) -> None:
        """Two instances of one pipeline: the one with a stale view still cannot move progress back."""
        ahead, stale = make_store(), make_store()
        ahead.upsert_progress(APPLY_WORKER, Lsn(2**63 + 5))
        assert stale.upsert_progress(APPLY_WORKER, Lsn(2**63 - 5)) == 2**63 + 5
        assert stale.get_progress(APPLY_WORKER) == 2**63 + 5

    def test_instances_do_not_undo_each_others_writes(self, make_store: MakeStore) -> None:
        first, second = make_store(), make_store()
        first.update_table_states({T1: TableState(TableStateKind.READY)})
        second.update_table_states({T2: TableState.init()})
        first.store_table_schema(make_schema(T1, 1))
        second.store_destination_metadata(T2, sample_metadata())
        reopened = make_store()
        assert reopened.get_table_states() == {T1: TableState(TableStateKind.READY), T2: TableState.init()}
        assert reopened.get_table_schemas() == [make_schema(T1, 1)]
        assert reopened.get_destination_metadata(T2) == sample_metadata()

    def test_resync_requests_reach_the_lock_holder_once(self, make_store: MakeStore) -> None:
        """``etl resync`` asks through its own instance, without the lock; the running pipeline takes it once."""
        running, asking = make_store(), make_store()
        running.acquire_lock()
        asking.request_resync(T1)
        asking.request_resync(T1)
        asking.request_resync(T2)
        assert running.take_resync_requests() == {T1: None, T2: None}
        assert running.take_resync_requests() == {}
        asking.request_resync(T2)
        assert make_store().take_resync_requests() == {T2: None}, "a request is durable until taken"

    def test_a_backfill_request_keeps_its_predicate_and_a_whole_table_request_wins(self, make_store: MakeStore) -> None:
        """``etl resync --where``: the predicate as given (quotes, newlines, ``%``); a request for the whole table
        made before or after a backfill's, before they are taken, asks for the whole table."""
        running, asking = make_store(), make_store()
        running.acquire_lock()
        odd = "note LIKE 'a%' AND id <> 0 -- it's\n OR \"Odd Name\" IS NULL"
        asking.request_resync(T1, where="id < 10")
        asking.request_resync(T1, where=odd)  # the later predicate
        asking.request_resync(T2)
        asking.request_resync(T2, where="id < 10")  # the whole table stays asked for
        asking.request_resync(T3, where="id < 5")
        asking.request_resync(T3)
        assert make_store().take_resync_requests() == {T1: odd, T2: None, T3: None}
        assert running.take_resync_requests() == {}


def _start_holder(cls: type[Any], config: dict[str, Any], pipeline_id: int) -> subprocess.Popen[bytes]:
    """A subprocess that opens the store from ``config``, takes the lock and waits."""
    target = f"{cls.__module__}:{cls.__qualname__}"
    importlib.import_module(cls.__module__)  # fail here, not in the child, when the class cannot be imported
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER_SCRIPT, target, str(pipeline_id)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(config, default=str).encode() + b"\n")
    proc.stdin.flush()
    output = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 60
        while b"LOCKED\n" not in output:
            remaining = deadline - time.monotonic()
            chunk = os.read(proc.stdout.fileno(), 65536) if remaining > 0 and selector.select(remaining) else b""
            if not chunk:
                proc.kill()
                _, stderr = proc.communicate()
                raise AssertionError(
                    f"the lock holder did not take the lock:\n{(output + stderr).decode(errors='replace')}"
                )
            output += chunk
    return proc
