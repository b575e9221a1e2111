"""The destination protocol.

Delivery is at-least-once: after a crash the engine replays from the last durable progress, so
every write must be idempotent (dedupe by ``(commit_lsn, tx_ordinal)`` or upsert by key). Per-table
order is guaranteed; a batch ends at a commit, but for a transaction larger than a batch (``max_bytes``), which is
split over batches. Methods are called from worker threads;
``write_table_rows`` for different tables may run concurrently.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol, Self, runtime_checkable

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from etl.copy_plan import CopyPlan
from etl.events import EventBatch
from etl.lsn import Lsn
from etl.plugin_factory import PluginFactory
from etl.schema import TableName, TableSchema
from etl.store.base import Store


class WriteResult(StrEnum):
    ACCEPTED = "accepted"
    """Taken, but not yet durable; the engine calls ``flush`` before it records progress past it."""
    DURABLE = "durable"
    """Durable: progress may move past it."""


@dataclass(frozen=True)
class DestinationContext:
    pipeline_id: int
    store: Store
    """For destination table metadata (``get/store_destination_metadata``)."""


@runtime_checkable
class Destination(Protocol):
    name: ClassVar[str]

    def startup(self) -> None:
        """Connect and check the destination is usable; raise ``DestinationError`` with a hint if not."""

    def shutdown(self) -> None:
        """Release resources. Idempotent."""

    def drop_table_for_copy(self, schema: TableSchema) -> None:
        """Drop the table's destination object and private replay state before a fresh copy. Idempotent."""

    def write_table_rows(self, schema: TableSchema, rows: pa.Table) -> WriteResult:
        """Write copied rows (columns as in ``schema``). Called at least once per copied table, even empty."""

    def write_events(self, batch: EventBatch) -> WriteResult:
        """Apply a batch of streamed changes."""

    def flush(self) -> None:
        """Make every write the calling thread had accepted durable (the engine flushes from the writing thread)."""


@runtime_checkable
class Paced(Protocol):
    """Optional for destinations: a least time between the starts of two batch writes of one writer.

    The engine then hands a batch over once ``max_fill_ms`` has passed *and* the interval since the
    writer's previous write began; changes arriving meanwhile join the batch, up to ``busy_max_bytes``. A batch
    that reaches it goes as soon as the write in flight has ended, so a busy source is never held back.
    For destinations whose writes count against quotas or cost per write (BigQuery's load jobs and DML).
    """

    min_write_interval_s: float


@runtime_checkable
class TableCopier(Protocol):
    """Optional for destinations: copy a table itself, from a plan, instead of receiving its rows.

    The engine then hands each table's initial copy over as a ``CopyPlan`` (connection settings,
    exported snapshot, ranges, row filter, schema) and calls neither ``write_table_rows`` nor ``flush``
    for it. It keeps the snapshot open until ``copy_table`` returns, then streams the table as usual.
    A destination on a cluster runs the ranges where its data work runs, so copied rows need not pass
    through the pipeline's process.
    """

    def copy_table(self, plan: CopyPlan, stop: threading.Event) -> int:
        """Copy every row of the plan into the table, created anew, and make it durable; return the row count.

        ``drop_table_for_copy`` was called before. A copy cut short (a crash, an error) is started again
        from scratch, so rows of an unfinished copy must never become visible. When ``stop`` is set, give
        up soon and raise ``etl.postgres.copy.CopyStopped``.
        """


@dataclass
class StagedChunk:
    """An incremental copy's chunk staged by ``ChunkCopier.stage_chunk``, none of it visible yet; destinations
    subclass it with what they need to make it visible."""

    rows: int
    """The rows staged."""
    watermark: tuple[Lsn, int]
    """The chunk's place among the stream's changes (``ChunkCopier.stage_chunk``)."""


@runtime_checkable
class ChunkCopier(Protocol):
    """Optional for destinations: write an incremental copy's chunks themselves, from a plan, instead of receiving
    their rows as batches of inserts (``write_events``).

    The engine then hands over each chunk of keys that no run wrote before as a ``CopyPlan`` whose ranges are key
    ranges (``CopyRange.key_chunk``, read with ``read_ranges``), in an exported snapshot it keeps open until
    ``stage_chunk`` returns. Staging runs on a copy thread of the engine's while the stream's batches are written
    (of other tables: the table's own changes wait for its chunk), up to ``[pipeline] table_sync_workers`` tables at
    once; ``commit_chunk`` then runs between two writes of the stream. Chunks of keys that a run which died may have
    written still come as batches (of updates), as do a backfill's.
    """

    def stage_chunk(self, plan: CopyPlan, watermark: tuple[Lsn, int], stop: threading.Event) -> StagedChunk:
        """Read the plan's rows and write them where ``commit_chunk`` can make them visible in one step; none of them
        visible before. Thread-safe with ``write_events`` and with other tables' ``stage_chunk``.

        ``watermark`` is the chunk's place among the stream's changes: the commit position and ordinal its last
        row would carry in a batch, past every change of the table written before it (a destination that skips what
        it applied before records it as applied when the chunk commits). When ``stop`` is set, give up soon and
        raise ``etl.postgres.copy.CopyStopped``, leaving nothing staged.
        """

    def commit_chunk(self, staged: StagedChunk) -> int:
        """Add the staged rows to the table as new rows, durable on return, and move its watermark to the staged
        ``watermark``; return how many. Called between two writes of the stream, none in flight."""

    def discard_chunk(self, staged: StagedChunk) -> None:
        """Drop what ``stage_chunk`` staged: the chunk is read again later, or its copy ended. Idempotent."""


class InProcessDestination:
    """Base for destinations that keep what they receive inside this process (memory, null).

    They take no options, have nothing to connect to or release, and every write is durable when it
    returns, so ``startup``, ``shutdown`` and ``flush`` do nothing.
    """

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid")

    @classmethod
    def from_config(cls, config: Config, context: DestinationContext) -> Self:
        return cls()

    def startup(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def flush(self) -> None:
        pass


@dataclass(frozen=True)
class TablePreview:
    """A destination table read back through the destination's own reader."""

    total: int
    """Rows in the table."""
    rows: list[dict[str, Any]]
    """Its first rows (at most the ``limit`` asked for), ordered by their columns, as the reader returns them."""
    reader: str
    """Who read them, for people: ``"the memory destination"``, ``"DuckDB 1.5.5"``."""


@runtime_checkable
class PreviewableDestination(Protocol):
    """Optional for destinations: read a table back the way its users would (``etl demo`` prints it)."""

    def preview(self, table: TableName, limit: int) -> TablePreview:
        """The table's row count and first ``limit`` rows; ``KeyError`` when the table is not there (yet)."""


@dataclass(frozen=True)
class DestinationPosition:
    """Where a destination says it stands in the source's stream, as it recorded it itself."""

    lsn: Lsn
    """The end of the last batch of the pipeline the destination holds."""
    detail: str
    """What holds it, for people: ``"DuckLake snapshot 42"``."""


@runtime_checkable
class PositionedDestination(Protocol):
    """Optional for destination classes: read the position the destination recorded for a pipeline, without
    starting it (``etl status`` shows it beside the store's progress)."""

    @classmethod
    def recorded_position(cls, config: Any, pipeline_id: int) -> DestinationPosition | None:
        """The position recorded for ``pipeline_id`` in the destination ``config`` names; ``None`` before its first
        batch. Read-only; an ``EtlError`` when the destination cannot be read."""
        ...


DestinationFactory = PluginFactory[DestinationContext, Destination]
"""What a destination plugin registers: a class with ``name``, ``Config`` and ``from_config(config, context)``."""
