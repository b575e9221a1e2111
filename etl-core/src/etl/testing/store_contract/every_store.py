"""``StoreContract``: the tests every store must pass."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pydantic
import pytest

from etl.errors import StoreError
from etl.lsn import Lsn
from etl.store.base import (
    APPLY_WORKER,
    CopyProgress,
    DestinationTableMetadata,
    Store,
    TableState,
    TableStateKind,
    table_sync_worker,
)
from etl.testing.store_contract.samples import (
    T1,
    T2,
    T3,
    MakeStore,
    make_schema,
    sample_activity,
    sample_copy_progress,
    sample_metadata,
    sample_states,
)


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
