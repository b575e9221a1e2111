"""The store protocol: everything a pipeline must remember across restarts.

A store keeps, per pipeline id:

- table states, with their history so a state can be rolled back;
- versioned table schemas, keyed by the LSN from which each version holds;
- durable progress per worker (the apply worker and each table sync worker), never moving back;
- destination table metadata (which destination object holds a table, under which schema);
- where each table's initial copy stands (rows copied so far), for ``etl status`` in another process;
- what the running pipeline wrote into each table since it started (``TableActivity``), for the same.

Stores are called from several threads at once and must be thread-safe. Reads are served from a
cache loaded on open; writes go to durable storage before they return, and a write that fails
changes nothing. Invalid arguments (a memory-only state kind, an LSN outside the unsigned 64-bit
range, a naive ``retry_at`` or copy time, non-JSON ``extra``) raise ``ValueError``/``TypeError``; failures of the
storage raise ``StoreError`` (``TransientError`` when a connection was lost and a retry may work).
Writes after ``close`` raise ``StoreError``.

``etl.testing.store_contract`` holds the tests every store must pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar, Protocol, runtime_checkable

from etl.lsn import Lsn
from etl.plugin_factory import PluginFactory
from etl.schema import TableId, TableSchema


class TableStateKind(StrEnum):
    INIT = "init"
    DATA_SYNC = "data_sync"
    FINISHED_COPY = "finished_copy"
    SYNC_WAIT = "sync_wait"  # in memory only
    CATCHUP = "catchup"  # in memory only
    SYNC_DONE = "sync_done"
    COPYING = "copying"
    """Copied in chunks by the apply worker while its changes stream (``[copy] method = "incremental"``)."""
    READY = "ready"
    ERRORED = "errored"

    @property
    def persisted(self) -> bool:
        return self not in (TableStateKind.SYNC_WAIT, TableStateKind.CATCHUP)

    @property
    def copied(self) -> bool:
        """The destination holds the table's copy, finished or (``COPYING``) as far as its chunks went: what a
        destination checks at start, so that a lost one is never filled again from the middle."""
        return self in (
            TableStateKind.FINISHED_COPY,
            TableStateKind.SYNC_DONE,
            TableStateKind.COPYING,
            TableStateKind.READY,
        )


class RetryKind(StrEnum):
    NONE = "none"  # needs a code or source fix; never retried
    MANUAL = "manual"  # retried after the user acts (e.g. `etl resync`)
    TIMED = "timed"  # retried automatically at ``retry_at``


@dataclass(frozen=True)
class TableState:
    kind: TableStateKind
    lsn: Lsn | None = None
    """For CATCHUP and SYNC_DONE: the LSN the table sync worker caught up to."""
    reason: str | None = None
    hint: str | None = None
    retry: RetryKind = RetryKind.NONE
    retry_at: datetime | None = None

    @classmethod
    def init(cls) -> TableState:
        return cls(TableStateKind.INIT)

    @classmethod
    def errored(
        cls, reason: str, hint: str | None = None, retry: RetryKind = RetryKind.MANUAL, retry_at: datetime | None = None
    ) -> TableState:
        return cls(TableStateKind.ERRORED, reason=reason, hint=hint, retry=retry, retry_at=retry_at)

    def __str__(self) -> str:
        if self.kind is TableStateKind.ERRORED:
            if self.retry is RetryKind.TIMED and self.retry_at is not None:
                return f"errored (next retry at {self.retry_at:%Y-%m-%d %H:%M:%S} UTC): {self.reason}"
            return f"errored: {self.reason}"
        return f"{self.kind.value}@{self.lsn}" if self.lsn is not None else self.kind.value


APPLY_WORKER: str = "apply"


def merged_request(pending: Mapping[TableId, str | None], table_id: TableId, where: str | None) -> str | None:
    """The predicate of a resync request made while another one for the table waits in ``pending``: the whole
    table (``None``) when either asks for it, else the later predicate."""
    return None if table_id in pending and pending[table_id] is None else where


def table_sync_worker(table_id: TableId) -> str:
    """The worker key of a table's sync worker."""
    return f"table_sync:{table_id}"


class DestinationSchemaStatus(StrEnum):
    APPLYING = "applying"  # a schema change is being applied to the destination object
    APPLIED = "applied"


@dataclass(frozen=True)
class DestinationTableMetadata:
    destination_table: str
    """The destination's name for the object holding the table."""
    snapshot_lsn: Lsn
    """Version of the source schema the destination object currently has."""
    status: DestinationSchemaStatus = DestinationSchemaStatus.APPLIED
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Destination-private JSON-serialisable data."""


@dataclass(frozen=True)
class CopyProgress:
    """Where a table's initial copy stands: counted by the table sync worker, recorded in the store, shown by
    ``etl status``. Times are timezone-aware (stores give them back in UTC)."""

    rows: int
    """Rows copied so far."""
    estimate: int | None
    """Rows the planner expects (``reltuples``); ``None`` when the table was never analyzed."""
    started_at: datetime
    """When the copy began."""
    recorded_at: datetime
    """When ``rows`` was counted."""
    finished: bool = False
    """The copy wrote its last row (the table moved on to catching up)."""
    resume_after: str | None = None
    """An incremental copy's key after which its next chunk begins (JSON); ``None`` before its first chunk."""

    @property
    def seconds(self) -> float:
        """From the start of the copy to ``recorded_at``."""
        return max(0.0, (self.recorded_at - self.started_at).total_seconds())

    @property
    def rate(self) -> float:
        """Rows per second over the whole copy so far."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def fraction(self) -> float | None:
        """Share copied: 1 once finished, else the share of the estimate (capped at 1: estimates lag behind the
        table); ``None`` without an estimate."""
        if self.finished:
            return 1.0
        return min(1.0, self.rows / self.estimate) if self.estimate else None

    @property
    def eta_seconds(self) -> float | None:
        """Seconds left at the rate so far (0 once finished); ``None`` without an estimate or a rate."""
        if self.finished:
            return 0.0
        if not self.estimate or self.rate <= 0:
            return None
        return max(0.0, (self.estimate - self.rows) / self.rate)

    def age(self, now: datetime | None = None) -> float:
        """Seconds since this was recorded (a copy that stopped reporting has a growing age)."""
        return max(0.0, ((now or datetime.now(UTC)) - self.recorded_at).total_seconds())


@dataclass(frozen=True)
class TableActivity:
    """What the pipeline's run wrote into a table: changes by kind since the run began, and when the last of its
    streamed batches became durable. Recorded by the running pipeline every few seconds, for ``etl status``."""

    inserts: int
    updates: int
    deletes: int
    truncates: int
    since: datetime
    """When the run that counted these began."""
    last_write_at: datetime
    """When the last batch with changes of the table was durable in the destination."""


@runtime_checkable
class Store(Protocol):
    """Durable pipeline state. See the module docstring for the contract."""

    name: ClassVar[str]

    # -- lifecycle -------------------------------------------------------------------------------
    def acquire_lock(self) -> None:
        """Take the pipeline lock, or raise ``PipelineLockedError`` at once if another process holds it.

        The lock is per (store, pipeline id), held until ``close`` or the death of the process.
        Calling it again while holding the lock does nothing. Stores whose state cannot be shared
        between processes (memory) have nothing to lock.
        """

    def close(self) -> None:
        """Release the lock and any connections. Idempotent."""

    # -- table states ------------------------------------------------------------------------------
    def get_table_state(self, table_id: TableId) -> TableState | None: ...

    def get_table_states(self) -> dict[TableId, TableState]: ...

    def update_table_states(self, updates: Mapping[TableId, TableState]) -> None:
        """Set several states atomically; the previous states go to history (a bounded number per table).

        Only persisted kinds are accepted (``ValueError`` for SYNC_WAIT and CATCHUP, which the
        engine keeps in memory); ``retry_at`` must be timezone-aware and comes back in UTC.
        """

    def rollback_table_state(self, table_id: TableId) -> TableState:
        """Restore the previous state and return it; ``StoreError`` when there is none."""

    # -- schemas -----------------------------------------------------------------------------------
    def get_table_schema(self, table_id: TableId, at: Lsn = Lsn.MAX) -> TableSchema | None:
        """The newest schema version with ``snapshot_lsn <= at``."""

    def get_table_schemas(self) -> list[TableSchema]:
        """Every stored version of every table."""

    def store_table_schema(self, schema: TableSchema) -> None:
        """Add (or replace) the version keyed by ``(schema.id, schema.snapshot_lsn)``."""

    def prune_table_schemas(self, retain_from: Mapping[TableId, Lsn]) -> int:
        """Per table named, keep the newest version at or before its LSN and all newer ones; delete the older ones.

        Returns how many versions were deleted. Tables not named are untouched.
        """

    # -- progress ----------------------------------------------------------------------------------
    def get_progress(self, worker: str) -> Lsn | None: ...

    def upsert_progress(self, worker: str, lsn: Lsn) -> Lsn:
        """Store ``max(stored, lsn)`` and return what is stored.

        The maximum is taken by the storage itself, so progress never moves back even when two
        store instances of one pipeline write.
        """

    def delete_progress(self, worker: str) -> None: ...

    # -- destination metadata ------------------------------------------------------------------------
    def get_destination_metadata(self, table_id: TableId) -> DestinationTableMetadata | None: ...

    def store_destination_metadata(self, table_id: TableId, metadata: DestinationTableMetadata) -> None:
        """Add or replace. ``extra`` is kept as JSON: it comes back with lists for tuples and dicts for mappings."""

    # -- lifecycle operations ------------------------------------------------------------------------
    def prepare_table_for_copy(self, table_id: TableId) -> None:
        """Delete the table's destination metadata, schemas, sync progress and copy progress; keep its state."""

    def reset_tables_for_resync(self) -> int:
        """Set every table to INIT and delete the apply worker's progress; returns how many tables.

        Schemas, destination metadata, table sync progress and copy progress are kept.
        """

    def delete_table_state(self, table_id: TableId) -> None:
        """Forget everything about a table that left the publication: its state and history, schemas,
        destination metadata, table sync progress and copy progress. The destination's objects are not touched."""

    # -- copy progress -------------------------------------------------------------------------------
    def record_copy_progress(self, table_id: TableId, progress: CopyProgress) -> None:
        """Record where the table's copy stands, replacing what was recorded before.

        The table sync worker records it when the copy starts, every few seconds and when it ends, so
        ``etl status`` in another process can show it. It is kept after the copy (the last copy's rows,
        time and rate) until ``prepare_table_for_copy`` starts the next copy or ``delete_table_state``
        forgets the table; ``reset_tables_for_resync`` keeps it. ``rows`` and ``estimate`` must be
        non-negative 64-bit integers and the times timezone-aware (``ValueError``); they come back in UTC.
        """

    def get_copy_progress(self, table_id: TableId) -> CopyProgress | None:
        """What ``record_copy_progress`` recorded last for the table, or ``None``."""

    # -- table activity ----------------------------------------------------------------------------------
    def record_table_activity(self, activity: Mapping[TableId, TableActivity]) -> None:
        """Record what the running pipeline wrote into these tables, replacing what was recorded for them before
        (other tables keep theirs); ``delete_table_state`` forgets a table's. Counts must be non-negative 64-bit
        integers and the times timezone-aware (``ValueError``); they come back in UTC."""

    def get_table_activity(self) -> dict[TableId, TableActivity]:
        """What ``record_table_activity`` recorded last for each table."""

    # -- requests from the pipeline's owner ------------------------------------------------------------
    def request_resync(self, table_id: TableId, where: str | None = None) -> None:
        """Ask the pipeline to copy a table again (``etl resync``), from any process, without the pipeline lock;
        with ``where`` (a SQL predicate), to copy only the rows it picks into the table as it is (a backfill).

        The request is durable and reaches a pipeline running in another process through
        ``take_resync_requests``; asking twice before it is taken asks once, for the whole table when either
        asked for it, else with the later predicate. Only whoever can write the store can ask, which is what
        makes the request trustworthy (nothing in the source's WAL is). A store whose state lives in one process
        (memory) raises ``StoreError``.
        """

    def take_resync_requests(self) -> dict[TableId, str | None]:
        """The tables asked for since the last call, each with its predicate (``None``: the whole table), read
        from storage (not a cache), and forget them."""


StoreFactory = PluginFactory[int, Store]
"""What a store plugin registers: a class with ``name``, ``Config`` and ``from_config(config, pipeline_id)``."""
