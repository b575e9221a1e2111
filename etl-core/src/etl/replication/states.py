"""Table states shared by the workers of one pipeline, persisted through the store."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from etl.lsn import Lsn
from etl.schema import TableId
from etl.store.base import Store, TableState, TableStateKind


class TableStates:
    """The live table states: a condition variable over the store's states plus the in-memory ones.

    SYNC_WAIT and CATCHUP exist only here; every other state is written to the store before it is
    visible to the other workers.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._changed = threading.Condition()
        self._states: dict[TableId, TableState] = dict(store.get_table_states())
        self.waiting_on_apply = _waiting_on_apply(self._states)
        """Some table waits for the apply worker (SyncWait or SyncDone); kept up to date on every change."""

    def reload(self) -> None:
        """Read the states again from the store, after the store changed them directly."""
        with self._changed:
            self._states = dict(self._store.get_table_states())
            self.waiting_on_apply = _waiting_on_apply(self._states)
            self._changed.notify_all()

    def get(self, table_id: TableId) -> TableState | None:
        with self._changed:
            return self._states.get(table_id)

    def snapshot(self) -> dict[TableId, TableState]:
        with self._changed:
            return dict(self._states)

    def set(self, table_id: TableId, state: TableState) -> None:
        self.set_many({table_id: state})

    def set_many(self, updates: Mapping[TableId, TableState]) -> None:
        with self._changed:
            persisted = {t: s for t, s in updates.items() if s.kind.persisted}
            if persisted:
                self._store.update_table_states(persisted)
            self._states.update(updates)
            self.waiting_on_apply = _waiting_on_apply(self._states)
            self._changed.notify_all()

    def forget(self, table_id: TableId) -> None:
        with self._changed:
            self._store.delete_table_state(table_id)
            self._states.pop(table_id, None)
            self.waiting_on_apply = _waiting_on_apply(self._states)
            self._changed.notify_all()

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` (evaluated under the lock) holds or ``timeout`` passes."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def applies(self, table_id: TableId, final_lsn: Lsn) -> bool:
        """The visibility rule: the apply worker applies a change of a Ready table, or of a SyncDone
        table when the transaction commits at or after the LSN its sync worker stopped at."""
        state = self._states.get(table_id)  # a dict read is atomic; no lock on the hot path
        if state is None:
            return False
        if state.kind in (TableStateKind.READY, TableStateKind.COPYING):  # COPYING: the apply worker filters by key
            return True
        return state.kind is TableStateKind.SYNC_DONE and state.lsn is not None and state.lsn <= final_lsn


def _waiting_on_apply(states: Mapping[TableId, TableState]) -> bool:
    return any(s.kind in (TableStateKind.SYNC_WAIT, TableStateKind.SYNC_DONE) for s in states.values())
