"""A table's copy as a value: which ranges of which tables to read, from what snapshot, with which columns.

The engine plans it (``etl.postgres.copy.plan_copy``) while it holds the copy's snapshot open; a destination that
copies tables itself (``etl.destination.base.TableCopier``) hands its ranges to workers anywhere (Spark executors,
say), each of which reads them with ``etl.postgres.copy.read_ranges``. Nothing here does I/O, and a plan pickles
(the password stays a ``SecretStr``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from etl.config import PostgresConnection
from etl.errors import TransientError
from etl.key_chunk import KeyChunk
from etl.schema import TableName, TableSchema

RANGES_PER_CONNECTION: Final = 4
"""Ranges planned per connection and table, so that uneven ranges still spread evenly."""


class CopyStopped(TransientError):
    """The caller's ``stop`` event was set before the copy finished; the table was not copied in full."""


@dataclass(frozen=True)
class CtidRange:
    """Heap pages ``[start_block, end_block)``; ``None`` leaves that side open."""

    start_block: int | None
    end_block: int | None

    def predicate(self) -> str | None:
        """The SQL condition selecting the range's rows; ``None`` for the whole table."""
        parts = []
        if self.start_block is not None:
            parts.append(f"ctid >= '({self.start_block},0)'::tid")
        if self.end_block is not None:
            parts.append(f"ctid < '({self.end_block},0)'::tid")
        return " AND ".join(parts) or None


@dataclass(frozen=True)
class CopyRange:
    """One piece of a table's copy: a ctid range of the table or of one of its leaf partitions; or a key range
    of an incremental copy's chunk."""

    source: TableName
    """The table itself or, for a partitioned table, a leaf."""
    ctid_range: CtidRange | None
    """``None``: the whole of ``source`` (or of ``key_chunk``)."""
    key_chunk: KeyChunk | None = None
    """A part of an incremental copy's chunk: its rows, in key order."""


@dataclass(frozen=True)
class CopyPlan:
    """Everything needed to copy one table, from any process that reaches the source: every range reads the
    table as of the snapshot, so together they hold each row exactly once."""

    connection: PostgresConnection
    snapshot: str | None
    """The exported snapshot to import (``None``: each range reads its own, consistent only as one range)."""
    schema: TableSchema
    """The columns to copy (the publication's column list applied) and their types."""
    ranges: tuple[CopyRange, ...]
    row_filter: str | None
    """The publication's row filter, as SQL."""
    size_bytes: int | None = None
    """The source tables' size, TOAST included, when the copy was planned (about what it reads); None: not measured."""
