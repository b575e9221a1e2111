"""The store protocol implemented once over an in-memory cache.

``CachedStore`` holds every piece of pipeline state in memory and answers all reads from there. Each
write first computes its effect, then hands it to a ``_persist_*`` hook, and changes the cache only
when the hook returns. The memory store keeps the no-op hooks; durable stores override them to write
to their database (one transaction per call), so a failed write leaves the cache as it was and all
stores share one set of semantics.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import ClassVar

from etl.errors import StoreError
from etl.lsn import Lsn
from etl.schema import TableId, TableSchema
from etl.store.base import (
    APPLY_WORKER,
    CopyProgress,
    DestinationTableMetadata,
    TableActivity,
    TableState,
    TableStateKind,
    table_sync_worker,
)
from etl.store.codec import check_lsn, extra_to_json

_CACHES = ("_states", "_schemas", "_progress", "_metadata", "_copy_progress", "_activity")
"""The attributes that hold what the store read from storage."""

STATE_HISTORY_LIMIT = 20
"""States kept per table (the current one and those before it, for rollback); older ones are dropped."""

_MAX_ID = 2**63 - 1


@dataclass(frozen=True)
class StateRow:
    """One entry of a table's state history; ``seq`` grows by one per update of that table."""

    table_id: TableId
    seq: int
    state: TableState


class CachedStore:
    """Store protocol semantics over an in-memory cache; subclasses make writes durable.

    Thread-safe: one re-entrant mutex serialises writes (hook plus cache update) and guards reads.
    Subclasses fill the cache on open with ``_load_*`` and override ``acquire_lock``,
    ``_release`` and the ``_persist_*`` hooks. A durable store fills the cache again once it holds the
    pipeline lock (``_replacing_cache``): what it read on open may be stale, since the previous holder
    may have written until it let go.
    """

    name: ClassVar[str]
    history_limit: ClassVar[int] = STATE_HISTORY_LIMIT

    def __init__(self, pipeline_id: int) -> None:
        if not isinstance(pipeline_id, int) or not 0 <= pipeline_id <= _MAX_ID:
            raise ValueError(f"pipeline id must be a non-negative 64-bit integer, got {pipeline_id!r}")
        self.pipeline_id = pipeline_id
        self._mutex = threading.RLock()
        self._closed = False
        self._states: dict[TableId, list[StateRow]] = {}
        self._schemas: dict[TableId, dict[Lsn, TableSchema]] = {}
        self._progress: dict[str, Lsn] = {}
        self._metadata: dict[TableId, DestinationTableMetadata] = {}
        self._copy_progress: dict[TableId, CopyProgress] = {}
        self._activity: dict[TableId, TableActivity] = {}

    @contextmanager
    def _replacing_cache(self) -> Iterator[None]:
        """Fill the cache anew inside: it starts empty (states, schemas, progress, destination metadata, copy
        progress, table activity), and is put back as it was when filling it fails."""
        with self._mutex:
            before = {name: getattr(self, name) for name in _CACHES}
            for name in _CACHES:
                setattr(self, name, {})
            try:
                yield
            except BaseException:
                for name, cache in before.items():
                    setattr(self, name, cache)
                raise

    def describe(self) -> str:
        """The store in words, for messages (no secrets)."""
        return f"{self.name} store"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()} pipeline={self.pipeline_id}>"

    # -- lifecycle -------------------------------------------------------------------------------
    def acquire_lock(self) -> None:
        """Nothing to lock here: the state lives and dies with this object."""

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._release()

    def _release(self) -> None:
        """Release the lock and connections (called once, by ``close``)."""

    def _check_open(self) -> None:
        """Raise ``StoreError`` once the store is closed (call it holding ``_mutex``)."""
        if self._closed:
            raise StoreError(
                f"{self.describe()} for pipeline {self.pipeline_id} is closed",
                hint="open a new store; a closed one no longer holds the pipeline lock",
            )

    @contextmanager
    def _writing(self) -> Iterator[None]:
        with self._mutex:
            self._check_open()
            self._check_lock()
            yield

    def _check_lock(self) -> None:
        """Raise ``StoreError`` when a pipeline lock this store took is gone (checked before each write)."""

    # -- table states ------------------------------------------------------------------------------
    def get_table_state(self, table_id: TableId) -> TableState | None:
        with self._mutex:
            history = self._states.get(table_id)
            return history[-1].state if history else None

    def get_table_states(self) -> dict[TableId, TableState]:
        with self._mutex:
            return {table_id: history[-1].state for table_id, history in self._states.items() if history}

    def update_table_states(self, updates: Mapping[TableId, TableState]) -> None:
        for table_id in updates:
            _check_table_id(table_id)
        updates = {table_id: _checked_state(state) for table_id, state in updates.items()}
        with self._writing():
            rows = [self._next_row(table_id, state) for table_id, state in updates.items()]
            if rows:
                self._persist_table_states(rows)
                self._push(rows)

    def rollback_table_state(self, table_id: TableId) -> TableState:
        with self._writing():
            history = self._states.get(table_id, [])
            if len(history) < 2:
                raise StoreError(
                    f"table {table_id} of pipeline {self.pipeline_id} has no previous state to roll back to",
                    hint="set the state explicitly instead (for example reset the table to init with `etl resync`)",
                )
            self._persist_rollback(table_id, history[-1].seq)
            history.pop()
            return history[-1].state

    def _next_row(self, table_id: TableId, state: TableState) -> StateRow:
        history = self._states.get(table_id)
        return StateRow(table_id, history[-1].seq + 1 if history else 1, state)

    def _push(self, rows: list[StateRow]) -> None:
        for row in rows:
            history = self._states.setdefault(row.table_id, [])
            history.append(row)
            del history[: -self.history_limit]

    # -- schemas -----------------------------------------------------------------------------------
    def get_table_schema(self, table_id: TableId, at: Lsn = Lsn.MAX) -> TableSchema | None:
        with self._mutex:
            versions = self._schemas.get(table_id)
            if not versions:
                return None
            lsns = sorted(versions)
            index = bisect.bisect_right(lsns, at)
            return versions[lsns[index - 1]] if index else None

    def get_table_schemas(self) -> list[TableSchema]:
        with self._mutex:
            return [
                self._schemas[table_id][lsn]
                for table_id in sorted(self._schemas)
                for lsn in sorted(self._schemas[table_id])
            ]

    def store_table_schema(self, schema: TableSchema) -> None:
        if not isinstance(schema, TableSchema):
            raise TypeError(f"expected a TableSchema, got {type(schema).__name__}")
        _check_table_id(schema.id)
        schema = replace(schema, snapshot_lsn=check_lsn(schema.snapshot_lsn))
        with self._writing():
            self._persist_table_schema(schema)
            self._schemas.setdefault(schema.id, {})[schema.snapshot_lsn] = schema

    def prune_table_schemas(self, retain_from: Mapping[TableId, Lsn]) -> int:
        boundaries = {table_id: check_lsn(lsn) for table_id, lsn in retain_from.items()}
        with self._writing():
            doomed: list[tuple[TableId, Lsn]] = []
            for table_id, boundary in boundaries.items():
                lsns = sorted(self._schemas.get(table_id, ()))
                index = bisect.bisect_right(lsns, boundary)  # lsns[index - 1] is the version in force at the boundary
                doomed += [(table_id, lsn) for lsn in lsns[: max(index - 1, 0)]]
            if doomed:
                self._persist_prune_table_schemas(doomed)
                for table_id, lsn in doomed:
                    del self._schemas[table_id][lsn]
            return len(doomed)

    # -- progress ----------------------------------------------------------------------------------
    def get_progress(self, worker: str) -> Lsn | None:
        with self._mutex:
            return self._progress.get(worker)

    def upsert_progress(self, worker: str, lsn: Lsn) -> Lsn:
        _check_worker(worker)
        lsn = check_lsn(lsn)
        with self._writing():
            stored = self._persist_progress(worker, lsn)
            self._progress[worker] = stored
            return stored

    def delete_progress(self, worker: str) -> None:
        with self._writing():
            if worker in self._progress:
                self._persist_delete_progress(worker)
                del self._progress[worker]

    # -- destination metadata ------------------------------------------------------------------------
    def get_destination_metadata(self, table_id: TableId) -> DestinationTableMetadata | None:
        with self._mutex:
            return self._metadata.get(table_id)

    def store_destination_metadata(self, table_id: TableId, metadata: DestinationTableMetadata) -> None:
        _check_table_id(table_id)
        if not isinstance(metadata, DestinationTableMetadata):
            raise TypeError(f"expected DestinationTableMetadata, got {type(metadata).__name__}")
        # What a database gives back: plain JSON values (tuples become lists, mappings dicts).
        metadata = replace(
            metadata, snapshot_lsn=check_lsn(metadata.snapshot_lsn), extra=json.loads(extra_to_json(metadata.extra))
        )
        with self._writing():
            self._persist_destination_metadata(table_id, metadata)
            self._metadata[table_id] = metadata

    # -- copy progress -------------------------------------------------------------------------------
    def get_copy_progress(self, table_id: TableId) -> CopyProgress | None:
        with self._mutex:
            return self._copy_progress.get(table_id)

    def record_copy_progress(self, table_id: TableId, progress: CopyProgress) -> None:
        _check_table_id(table_id)
        progress = _checked_copy_progress(progress)
        with self._writing():
            self._persist_copy_progress(table_id, progress)
            self._copy_progress[table_id] = progress

    # -- table activity ------------------------------------------------------------------------------
    def get_table_activity(self) -> dict[TableId, TableActivity]:
        with self._mutex:
            return dict(self._activity)

    def record_table_activity(self, activity: Mapping[TableId, TableActivity]) -> None:
        for table_id in activity:
            _check_table_id(table_id)
        checked = {table_id: _checked_activity(entry) for table_id, entry in activity.items()}
        with self._writing():
            self._persist_table_activity(checked)
            self._activity.update(checked)

    # -- lifecycle operations ------------------------------------------------------------------------
    def prepare_table_for_copy(self, table_id: TableId) -> None:
        with self._writing():
            self._persist_prepare_table_for_copy(table_id)
            self._forget_copy(table_id)

    def reset_tables_for_resync(self) -> int:
        with self._writing():
            rows = [self._next_row(table_id, TableState.init()) for table_id in sorted(self._states)]
            self._persist_reset_tables_for_resync(rows)
            self._push(rows)
            self._progress.pop(APPLY_WORKER, None)
            return len(rows)

    def delete_table_state(self, table_id: TableId) -> None:
        with self._writing():
            self._persist_delete_table_state(table_id)
            self._forget_copy(table_id)
            self._states.pop(table_id, None)
            self._activity.pop(table_id, None)

    # -- requests from the pipeline's owner ----------------------------------------------------------
    def request_resync(self, table_id: TableId, where: str | None = None) -> None:
        _check_table_id(table_id)
        with self._mutex:
            self._check_open()
            self._persist_resync_request(table_id, where)

    def take_resync_requests(self) -> dict[TableId, str | None]:
        with self._mutex:
            return self._take_resync_requests()

    def _forget_copy(self, table_id: TableId) -> None:
        self._metadata.pop(table_id, None)
        self._schemas.pop(table_id, None)
        self._progress.pop(table_sync_worker(table_id), None)
        self._copy_progress.pop(table_id, None)

    # -- persistence hooks: write durably (atomically per call) or raise; the cache is not yet changed --
    def _persist_table_states(self, rows: list[StateRow]) -> None:
        """Append the rows; drop each table's entries older than ``history_limit``."""

    def _persist_rollback(self, table_id: TableId, seq: int) -> None:
        """Delete history entry ``seq`` (the current one) of the table."""

    def _persist_table_schema(self, schema: TableSchema) -> None: ...

    def _persist_prune_table_schemas(self, versions: list[tuple[TableId, Lsn]]) -> None: ...

    def _persist_progress(self, worker: str, lsn: Lsn) -> Lsn:
        """Store ``max(stored, lsn)`` and return what is stored."""
        return max(self._progress.get(worker, Lsn.ZERO), lsn)

    def _persist_delete_progress(self, worker: str) -> None: ...

    def _persist_destination_metadata(self, table_id: TableId, metadata: DestinationTableMetadata) -> None: ...

    def _persist_copy_progress(self, table_id: TableId, progress: CopyProgress) -> None:
        """Add or replace the table's copy progress."""

    def _persist_table_activity(self, activity: dict[TableId, TableActivity]) -> None:
        """Upsert the tables' activity."""

    def _persist_prepare_table_for_copy(self, table_id: TableId) -> None:
        """Delete the table's destination metadata, schemas, table sync progress and copy progress."""

    def _persist_reset_tables_for_resync(self, rows: list[StateRow]) -> None:
        """Append the INIT rows (as ``_persist_table_states``) and delete the apply worker's progress."""

    def _persist_resync_request(self, table_id: TableId, where: str | None) -> None:
        """Record a request where a pipeline in another process reads it; this cache is not such a place."""
        raise StoreError(
            f"the {self.describe()} keeps its state inside one process, so no other process can reach the pipeline",
            hint="call Pipeline.resync() of the embedded pipeline, or use a store the pipeline shares"
            ' ([store] type = "sqlite" or "postgres")',
        )

    def _take_resync_requests(self) -> dict[TableId, str | None]:
        return {}

    def _persist_delete_table_state(self, table_id: TableId) -> None:
        """Delete everything stored about the table."""


def _check_table_id(table_id: object) -> None:
    if not isinstance(table_id, int) or isinstance(table_id, bool) or not 0 <= table_id <= _MAX_ID:
        raise ValueError(f"not a table id (a non-negative integer): {table_id!r}")


def _check_worker(worker: object) -> None:
    if not isinstance(worker, str) or not worker:
        raise ValueError(f"not a worker key (a non-empty string): {worker!r}")


def _check_count(what: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_ID:
        raise ValueError(f"{what} must be a non-negative 64-bit integer, got {value!r}")


def _checked_copy_progress(progress: object) -> CopyProgress:
    """The progress as stores keep it (times in UTC), or ``ValueError``/``TypeError``."""
    if not isinstance(progress, CopyProgress):
        raise TypeError(f"expected a CopyProgress, got {type(progress).__name__}")
    _check_count("copy progress rows", progress.rows)
    if progress.estimate is not None:
        _check_count("copy progress estimate", progress.estimate)
    return replace(
        progress,
        started_at=_utc("copy progress started_at", progress.started_at),
        recorded_at=_utc("copy progress recorded_at", progress.recorded_at),
        finished=bool(progress.finished),
    )


def _checked_activity(activity: object) -> TableActivity:
    """The activity as stores keep it (times in UTC), or ``ValueError``/``TypeError``."""
    if not isinstance(activity, TableActivity):
        raise TypeError(f"expected a TableActivity, got {type(activity).__name__}")
    for kind in ("inserts", "updates", "deletes", "truncates"):
        _check_count(f"table activity {kind}", getattr(activity, kind))
    return replace(
        activity,
        since=_utc("table activity since", activity.since),
        last_write_at=_utc("table activity last_write_at", activity.last_write_at),
    )


def _utc(what: str, value: object) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return value.astimezone(UTC)


def _checked_state(state: object) -> TableState:
    """The state as stores keep it (``retry_at`` in UTC), or ``ValueError``/``TypeError``."""
    if not isinstance(state, TableState):
        raise TypeError(f"expected a TableState, got {type(state).__name__}")
    if not state.kind.persisted:
        raise ValueError(f"table state {state.kind.value} is kept in memory only; a store does not persist it")
    if state.kind is TableStateKind.SYNC_DONE and state.lsn is None:
        raise ValueError("a sync_done state needs the LSN the table caught up to")
    retry_at = state.retry_at
    if retry_at is not None:
        if retry_at.utcoffset() is None:
            raise ValueError(f"retry_at must be timezone-aware, got {retry_at!r}")
        retry_at = retry_at.astimezone(UTC)
    return replace(state, lsn=None if state.lsn is None else check_lsn(state.lsn), retry_at=retry_at)
