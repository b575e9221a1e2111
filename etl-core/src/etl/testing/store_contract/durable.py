"""``DurableStoreContract`` and ``ConcurrentStoreContract``: stores whose state outlives the process, under a
pipeline lock; and those whose open instances write the same storage without undoing each other."""

from __future__ import annotations

import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from etl.errors import PipelineLockedError, StoreError
from etl.lsn import Lsn
from etl.store.base import (
    APPLY_WORKER,
    CopyProgress,
    Store,
    TableState,
    TableStateKind,
    table_sync_worker,
)
from etl.testing.store_contract.every_store import StoreContract
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
        expected = _everything(store)
        store.close()
        reopened = make_store()
        assert _everything(reopened) == expected
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


def _everything(store: Store) -> tuple[Any, ...]:
    """What the removals above leave, read back: states, schemas, metadata, progress and copy progress."""
    return (
        store.get_table_states(),
        store.get_table_schemas(),
        store.get_destination_metadata(T1),
        store.get_destination_metadata(T2),
        [store.get_progress(w) for w in (APPLY_WORKER, table_sync_worker(T1), table_sync_worker(T2))],
        [store.get_copy_progress(t) for t in (T1, T2, T3)],
    )
