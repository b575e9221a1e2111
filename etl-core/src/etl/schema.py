"""Identity and shape of replicated tables."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Protocol

from etl.errors import EtlError
from etl.lsn import Lsn

TableId = int
"""A table is identified by its Postgres relation OID, stable across renames."""


class TableNameError(EtlError, ValueError):
    """Text that is not a table name (an ``EtlError`` for the CLI, a ``ValueError`` for callers that expect one)."""


_TABLE_NAME_HINT = (
    "write it as schema.table or table (schema public); put a part that holds a dot, a capital letter, a space or"
    ' a quote in double quotes, doubling any quote inside, as in SQL: public."Order Items" or "my.schema".orders'
)


@dataclass(frozen=True, order=True)
class TableName:
    schema: str
    name: str

    @classmethod
    def parse(cls, text: str) -> TableName:
        """Parse ``schema.table`` or ``table`` (schema ``public``), as Postgres reads a qualified name.

        A part is either a plain identifier, folded to lower case as Postgres does (``Orders`` is
        ``orders``), or a double-quoted identifier taken as written, with ``""`` for a quote inside
        (``public."a.b"`` and ``"public.a".b`` are two different tables). ``str()`` renders the form
        this reads back. Raises ``TableNameError`` naming the problem otherwise.
        """
        parts = _split_qualified(text)
        if len(parts) == 1:
            return cls("public", parts[0])
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise TableNameError(
            f"not a table name: {text!r}: it has {len(parts)} dot-separated parts, expected schema.table",
            hint=_TABLE_NAME_HINT,
        )

    def quoted(self) -> str:
        """The name as a safely quoted SQL identifier."""
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    def __str__(self) -> str:
        """``schema.table`` for people: each part quoted only where needed, so ``parse`` reads it back."""
        return f"{display_ident(self.schema)}.{display_ident(self.name)}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """A SQL string literal (standard_conforming_strings is on in every supported Postgres)."""
    return "'" + text.replace("'", "''") + "'"


_PLAIN_IDENT = re.compile(r"[a-z_][a-z0-9_]*")


def display_ident(name: str) -> str:
    """``name`` as is when it is a plain lower-case identifier, else double-quoted (the rule of Postgres's
    ``quote_ident``, except that keywords stay unquoted: this is for reading, ``quote_ident`` is for SQL)."""
    return name if _PLAIN_IDENT.fullmatch(name) else quote_ident(name)


def _split_qualified(text: str) -> list[str]:
    """The parts of a dotted name with quoted identifiers; ``TableNameError`` on malformed text."""

    def fail(problem: str) -> TableNameError:
        return TableNameError(f"not a table name: {text!r}: {problem}", hint=_TABLE_NAME_HINT)

    parts: list[str] = []
    body = text.strip()
    i, end = 0, len(body)
    if not body:
        raise fail("it is empty")
    while True:
        if i < end and body[i] == '"':
            part, i = [], i + 1
            while True:
                close = body.find('"', i)
                if close < 0:
                    raise fail("a double quote is not closed")
                part.append(body[i:close])
                if body.startswith('"', close + 1):  # "" is a quote inside the name
                    part.append('"')
                    i = close + 2
                    continue
                i = close + 1
                break
            name = "".join(part)
            if not name:
                raise fail('"" is an empty name')
        else:
            start = i
            while i < end and body[i] not in '."':
                i += 1
            name = body[start:i]
            if not name:
                where = "at its start" if start == 0 else "at its end" if start == end else "between two dots"
                raise fail(f"a name is missing {where}")
            if i < end and body[i] == '"':
                raise fail(f"a double quote inside the unquoted name {name!r}")
            if any(ch.isspace() for ch in name):
                raise fail(f"the unquoted name {name!r} holds a space")
            name = name.translate(_ASCII_LOWER)  # Postgres folds unquoted names (ASCII letters only)
        parts.append(name)
        if i == end:
            return parts
        if body[i] != ".":
            raise fail(f"unexpected {body[i]!r} after the quoted name {name!r}")
        i += 1
        if i == end:
            raise fail("a name is missing at its end")


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


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
    missing_value: str | None = None
    """The value, in Postgres's text form, that rows older than the column hold: set when ``ADD COLUMN`` had a
    non-volatile default, which Postgres keeps once (``pg_attribute.attmissingval``) instead of rewriting the rows.
    ``None`` otherwise (no default, a volatile one, or not known: pgoutput does not send it)."""


@dataclass(frozen=True)
class TableSchema:
    """One version of a table's shape, valid from ``snapshot_lsn`` on."""

    id: TableId
    name: TableName
    columns: tuple[ColumnSchema, ...]
    replica_identity: ReplicaIdentity = ReplicaIdentity.DEFAULT
    snapshot_lsn: Lsn = field(default=Lsn.ZERO)
    partitions: tuple[TableId, ...] | None = None
    """For a table published through its partition root: the OIDs (sorted) of the leaf partitions whose rows
    its copy read. Later versions carry it over; ``None`` when not recorded (other tables, older stores)."""
    attachments: tuple[tuple[TableId, int], ...] | None = None
    """With ``partitions``: each partition of the tree then (OID, sorted) and the transaction id that attached it,
    so that one detached and attached again is told from one that stayed. ``None`` when not recorded."""

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
