"""Identity and shape of replicated tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from etl.lsn import Lsn

TableId = int
"""A table is identified by its Postgres relation OID, stable across renames."""


@dataclass(frozen=True, order=True)
class TableName:
    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """Parse ``schema.name`` (``public`` when no schema is given)."""
        schema, dot, name = text.rpartition(".")
        if not name:
            raise ValueError(f"not a table name: {text!r} (expected 'schema.table')")
        return cls(schema if dot else "public", name)

    def quoted(self) -> str:
        """The name as a safely quoted SQL identifier."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class ReplicaIdentity(StrEnum):
    """Which old-row columns Postgres logs for updates and deletes."""

    DEFAULT = "d"  # the primary key
    NOTHING = "n"
    FULL = "f"  # every column
    INDEX = "i"  # the columns of a chosen unique index


@dataclass(frozen=True)
class ColumnSchema:
    name: str
    type_oid: int
    type_modifier: int = -1
    nullable: bool = True
    primary_key: bool = False
    """Part of the table's replica identity key (the primary key for REPLICA IDENTITY DEFAULT)."""
    type_name: str = ""
    """Postgres type name as ``format_type`` prints it, for messages and user-defined types."""
    attnum: int | None = None
    """Postgres attribute number: a column's identity across renames, when known (not sent by pgoutput)."""
    default: str | None = None
    """The column default as SQL text, when known (from the catalog or the DDL trigger; not sent by pgoutput)."""


@dataclass(frozen=True)
class TableSchema:
    """One version of a table's shape, valid from ``snapshot_lsn`` on."""

    id: TableId
    name: TableName
    columns: tuple[ColumnSchema, ...]
    replica_identity: ReplicaIdentity = ReplicaIdentity.DEFAULT
    snapshot_lsn: Lsn = field(default=Lsn.ZERO)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def key_columns(self) -> list[ColumnSchema]:
        return [c for c in self.columns if c.primary_key]

    def with_snapshot(self, lsn: Lsn) -> TableSchema:
        return replace(self, snapshot_lsn=lsn)

    def same_shape(self, other: TableSchema) -> bool:
        """True when only the version differs."""
        return (self.name, self.columns, self.replica_identity) == (
            other.name,
            other.columns,
            other.replica_identity,
        )


class WireColumn(Protocol):
    """What a RELATION message tells of a column (``ColumnSchema`` has it too)."""

    @property
    def name(self) -> str: ...
    @property
    def type_oid(self) -> int: ...
    @property
    def type_modifier(self) -> int: ...


def renamed_in_place(old: Sequence[WireColumn], new: Sequence[WireColumn]) -> bool:
    """True when ``new`` reads as ``old`` with columns renamed in place: RELATION messages' rename rule.

    As many columns, every position keeps its type and type modifier, some name changed, and each
    changed name is new while the old one is gone. Dropping the last column and adding one of the
    same type reads the same way; only attribute numbers (the DDL trigger's) tell them apart.
    """
    if len(old) != len(new):
        return False
    old_names, new_names = {c.name for c in old}, {c.name for c in new}
    changed = False
    for before, after in zip(old, new, strict=True):
        if (before.type_oid, before.type_modifier) != (after.type_oid, after.type_modifier):
            return False
        if before.name != after.name:
            if after.name in old_names or before.name in new_names:
                return False
            changed = True
    return changed


def match_columns(old: TableSchema, new: TableSchema) -> list[tuple[int | None, ColumnSchema]]:
    """For each column of ``new``, the position of the same column in ``old`` (None for an added column).

    The same column is, in this order: the one with the same attribute number (a rename keeps it);
    the one with the same name, unless both attribute numbers are known and differ (a column dropped
    and added again under its old name is a new column); for a column neither version knows the
    attribute number of (added while only RELATION messages described the table), the one at the
    same position when ``renamed_in_place`` holds -- the rule the engine followed when it carried
    the column over. Destinations that follow schema versions with this need no guessing of their own.
    """
    picks: list[int | None] = [None] * len(new.columns)
    by_attnum = {c.attnum: i for i, c in enumerate(old.columns) if c.attnum is not None}
    for j, column in enumerate(new.columns):
        if column.attnum is not None:
            picks[j] = by_attnum.get(column.attnum)
    by_name = {c.name: i for i, c in enumerate(old.columns)}
    for j, column in enumerate(new.columns):
        i = by_name.get(column.name)
        if picks[j] is None and i is not None and i not in picks and None in (column.attnum, old.columns[i].attnum):
            picks[j] = i
    if renamed_in_place(old.columns, new.columns):
        for j, column in enumerate(new.columns):
            if picks[j] is None and j not in picks and column.attnum is None and old.columns[j].attnum is None:
                picks[j] = j
    return list(zip(picks, new.columns, strict=True))
