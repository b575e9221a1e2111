"""The ``ALTER TABLE`` actions that bring a BigQuery table's columns in line with a new source schema.

Columns are matched by name. Source columns left unmatched are paired with table columns left
unmatched at the same position among the unmatched, when their types agree: that is a rename
(Postgres keeps a column's position when it renames it). The rest are drops and adds (added columns
are nullable: BigQuery cannot add a REQUIRED column). A changed type cannot be altered in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from etl.errors import TableError
from etl.schema import TableSchema
from etl_spark.bigquery.names import column_name
from etl_spark.bigquery.types import bq_type

if TYPE_CHECKING:
    from google.cloud import bigquery

_LEGACY: Final = {"INTEGER": "INT64", "FLOAT": "FLOAT64", "BOOLEAN": "BOOL"}


def column_type(field: bigquery.SchemaField) -> str:
    """A table column's type in the spelling of ``bq_type(...).ddl``."""
    base = _LEGACY.get(field.field_type.upper(), field.field_type.upper())
    return f"ARRAY<{base}>" if field.mode == "REPEATED" else base


def alter_statements(table: bigquery.Table, schema: TableSchema) -> list[str]:
    """``ALTER TABLE`` actions (without the ``ALTER TABLE name`` prefix), renames first, then drops, then adds."""
    current = {f.name: column_type(f) for f in table.schema}
    wanted = {c.name: bq_type(c).ddl for c in schema.columns}
    for name, ddl in wanted.items():
        if name in current and current[name] != ddl:
            raise TableError(
                f"{schema.name}: column {name} changed type from {current[name]} to {ddl}",
                hint="resync the table (etl resync) to copy it again with the new type",
                table_id=schema.id,
            )
    new = [n for n in wanted if n not in current]
    old = [n for n in current if n not in wanted]
    renames: list[tuple[str, str]] = []
    if len(new) == len(old):
        renames = [(o, n) for o, n in zip(old, new, strict=True) if current[o] == wanted[n]]
    renamed_old, renamed_new = {o for o, _ in renames}, {n for _, n in renames}
    return [
        *(f"RENAME COLUMN {column_name(o)} TO {column_name(n)}" for o, n in renames),
        *(f"DROP COLUMN {column_name(o)}" for o in old if o not in renamed_old),
        *(f"ADD COLUMN {column_name(n)} {wanted[n]}" for n in new if n not in renamed_new),
    ]
