"""A table key's values as an incremental copy records them, and the SQL that compares its columns with them."""

from __future__ import annotations

from typing import Final, TypeAlias

from etl.errors import TableError
from etl.schema import TableId, TableSchema, quote_ident, quote_literal

KeyValue: TypeAlias = tuple[str, ...]
"""A value of a table's key as an incremental copy records it: each key column's value in Postgres's text form,
which the source reads back into the column's type (an unknown-typed literal compared with the column): so keys are
compared by the source, under the column's collation, never in Python."""

INTEGER_KEY_TYPES: Final = frozenset({20, 21, 23})
"""int8, int2 and int4: the key types whose order and text form the engine knows without asking the source."""
GT: Final = "OPERATOR(pg_catalog.>)"
LE: Final = "OPERATOR(pg_catalog.<=)"


def integer_key(schema: TableSchema) -> bool:
    """Whether the table's key is one integer column: Arrow orders it as the source does, and ``str`` of a value is
    its text form."""
    keys = schema.key_columns
    return len(keys) == 1 and keys[0].type_oid in INTEGER_KEY_TYPES


def key_row(columns: tuple[str, ...]) -> str:
    """The key's columns as one value to compare: the column, or a row of them (compared column by column)."""
    names = ", ".join(quote_ident(c) for c in columns)
    return names if len(columns) == 1 else f"ROW({names})"


def key_literal(value: KeyValue) -> str:
    """A key's value as SQL literals, of no type until compared with the key's columns (``key_row``)."""
    literals = ", ".join(quote_literal(v) for v in value)
    return literals if len(value) == 1 else f"ROW({literals})"


def key_text(columns: tuple[str, ...]) -> str:
    """A JSON array of the key's columns in text form (``KeyValue``), as SQL."""
    return f"pg_catalog.json_build_array({', '.join(f'{quote_ident(c)}::pg_catalog.text' for c in columns)})"


def parse_key(value: object) -> KeyValue:
    """A ``KeyValue`` from its JSON (a list of texts; an earlier release recorded an integer key as a number)."""
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return (str(int(value)),)  # type: ignore[call-overload]


def key_column_gone(table_id: TableId, what: str) -> TableError:
    """The error of an incremental copy whose key column ``what`` says is gone: the table is copied again."""
    return TableError(what, hint="the table is copied again from its first row", table_id=table_id, transient=True)
