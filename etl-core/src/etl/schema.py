"""Identity and shape of replicated tables."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

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


def match_columns(old: TableSchema, new: TableSchema) -> list[tuple[int | None, ColumnSchema]]:
    """For each column of ``new``, the position of the same column in ``old`` (None for an added column).

    A column is the same when its attribute number is (a rename keeps it); without attribute numbers
    on both sides, when its name is. The engine carries attribute numbers across renames, so
    destinations need no guessing of their own.
    """
    by_attnum = {c.attnum: i for i, c in enumerate(old.columns) if c.attnum is not None}
    by_name = {c.name: i for i, c in enumerate(old.columns)}
    return [
        (by_attnum.get(c.attnum) if c.attnum is not None and by_attnum else by_name.get(c.name), c) for c in new.columns
    ]
