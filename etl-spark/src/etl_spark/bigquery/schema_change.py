"""The ``ALTER TABLE`` actions that bring a BigQuery table's columns in line with a new source schema.

The destination records the source schema each table was last brought in line with (names, types
and attribute numbers, in ``_etl_columns``). A new schema's columns are matched against that record
with ``etl.schema.match_columns``: by attribute number (a rename keeps it), else by name. So a
rename is found after a restart, and a column dropped and another added is never taken for a
rename, whatever their types. Matched columns whose name changed are renamed, table columns left
unmatched are dropped, unmatched source columns are added (nullable: BigQuery cannot add a REQUIRED
column). A changed type cannot be altered in place.

A column added at the source with a constant default holds that value in every older row (Postgres keeps it
once, ``ColumnSchema.missing_value``, and logical decoding never sends it). BigQuery's ``ADD COLUMN`` leaves
older rows NULL (a column default applies to later inserts only), so an added column is then filled with an
``UPDATE``, in the transaction that records the new schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from etl.api import ColumnSchema, TableSchema, TypeChangeError, match_columns
from etl_spark.bigquery.names import column_name
from etl_spark.bigquery.types import bq_type, check_columns, literal

if TYPE_CHECKING:
    from google.cloud import bigquery

_LEGACY: Final = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}


def column_type(field: bigquery.SchemaField) -> str:
    """A table column's type in the spelling of ``bq_type(...).ddl``."""
    base = _LEGACY.get(field.field_type.upper(), field.field_type.upper())
    return f"ARRAY<{base}>" if field.mode == "REPEATED" else base


def unrecorded(table: bigquery.Table, schema: TableSchema, own: frozenset[str] = frozenset()) -> TableSchema:
    """What is known of a table without a record: its column names (matched by name only), but ``own``."""
    return TableSchema(
        schema.id, schema.name, tuple(ColumnSchema(f.name, 0) for f in table.schema if f.name not in own)
    )


@dataclass(frozen=True)
class Alteration:
    actions: list[str]
    """``ALTER TABLE`` actions (without the ``ALTER TABLE name`` prefix): drops, renames, then adds."""
    added: list[ColumnSchema]
    """The source columns the adds are for."""

    def fill(self, schema: TableSchema, target: str) -> list[str]:
        """The ``UPDATE`` giving the rows already in ``target`` the values the source's older rows hold in the
        added columns."""
        sets = ", ".join(
            f"{column_name(c.name)} = {literal(schema, c, c.missing_value)}"
            for c in self.added
            if c.missing_value is not None
        )
        return [f"UPDATE {target} SET {sets} WHERE TRUE"] if sets else []


def alter_statements(
    table: bigquery.Table,
    applied: TableSchema,
    schema: TableSchema,
    own: frozenset[str] = frozenset(),
    *,
    keep_dropped: bool = False,
) -> Alteration:
    """What brings ``table`` in line with ``schema``.

    ``applied`` is the source schema ``table`` was last brought in line with; the table's columns in
    ``own`` (the destination's) are left alone. With ``keep_dropped`` (a history table, whose rows
    keep every value they had) a dropped column is renamed to ``_etl_dropped_<attnum>_<name>`` instead.
    """
    check_columns(schema)
    current = {f.name: column_type(f) for f in table.schema if f.name not in own}
    kept: dict[str, str] = {}  # table column -> source column
    added: list[ColumnSchema] = []
    for index, column in match_columns(applied, schema):
        old = applied.columns[index].name if index is not None else None
        if old is None or old not in current:
            added.append(column)
            continue
        ddl = bq_type(column).ddl
        if current[old] != ddl:
            raise TypeChangeError(
                f"{schema.name}: column {column.name} changed type from {current[old]} to {ddl}",
                hint=f"copy the table again with the new type: etl resync -c <pipeline file> --table {schema.name}",
                table_id=schema.id,
            )
        kept[old] = column.name
    drops = [n for n in current if n not in kept]
    renames = [(o, n) for o, n in kept.items() if o != n]
    if any(n in kept for _, n in renames):  # a name passes to another column: free them all first
        renames = [(o, f"_etl_rename_{i}") for i, (o, _) in enumerate(renames)] + [
            (f"_etl_rename_{i}", n) for i, (_, n) in enumerate(renames)
        ]
    if keep_dropped:
        renames = _kept_drops(drops, applied, {f.name for f in table.schema}) + renames
        drops = []
    actions = [
        *(f"DROP COLUMN {column_name(o)}" for o in drops),
        *(f"RENAME COLUMN {column_name(o)} TO {column_name(n)}" for o, n in renames),
        *(f"ADD COLUMN {column_name(c.name)} {bq_type(c).ddl}" for c in added),
    ]
    return Alteration(actions, added)


def _kept_drops(drops: list[str], applied: TableSchema, taken: set[str]) -> list[tuple[str, str]]:
    """Renames that keep dropped columns as ``_etl_dropped_<attnum>_<name>``, numbered on where that name is
    taken (an attribute number can be unknown: a column dropped twice under one name)."""
    attnums = {c.name: c.attnum or 0 for c in applied.columns}
    renames = []
    for old in drops:
        base = f"_etl_dropped_{attnums.get(old, 0)}_{old}"
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        renames.append((old, name))
    return renames
