"""How a lake table's columns must change to match a new source schema.

The lake columns stand for the source schema this writer last applied: per column, the Postgres
attribute number and type it recorded. ``etl.schema.match_columns`` pairs that schema with the new
one by the engine's own rules (attribute number, which a rename keeps; else name; else a rename in
place), so the lake does not guess renames by rules of its own. A lake column whose
source is unknown (DuckDB added it) is matched by name only: an unknown type is never taken for
renamed in place. Everything else is a drop or an add;
an add gets a new column id, never a reused one, and the value the rows already stored hold
(``initial_default``). An array column that an earlier version of this writer made ``json`` stays ``json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etl.api import ColumnSchema, TableSchema, TypeChangeError, match_columns
from etl_spark.ducklake.catalog import UNKNOWN_SOURCE_TYPE, LakeColumn, NewColumn
from etl_spark.ducklake.initial_default import initial_default
from etl_spark.ducklake.types import LIST, lake_type

# Type changes DuckDB reads without rewriting files (a new column row with the same id).
_PROMOTIONS = {("int16", "int32"), ("int16", "int64"), ("int32", "int64"), ("float32", "float64")}


@dataclass
class SchemaDiff:
    adds: list[NewColumn] = field(default_factory=list)
    drops: list[LakeColumn] = field(default_factory=list)
    renames: list[tuple[LakeColumn, str]] = field(default_factory=list)
    retypes: list[tuple[LakeColumn, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.adds or self.drops or self.renames or self.retypes)


def diff(current: tuple[LakeColumn, ...], target: TableSchema) -> SchemaDiff:
    result = SchemaDiff()
    applied = TableSchema(
        target.id,
        target.name,
        tuple(ColumnSchema(c.name, *(c.source_type or UNKNOWN_SOURCE_TYPE), attnum=c.attnum) for c in current),
    )
    used: set[int] = set()
    for index, column in match_columns(applied, target):
        if index is None:
            added = lake_type(column)
            result.adds.append(NewColumn(column.name, added, column.nullable, initial_default(column, added)))
            continue
        existing = current[index]
        used.add(index)
        if existing.name != column.name:
            result.renames.append((existing, column.name))
        new_type = lake_type(column)
        old, new = _signature(existing), new_type.signature()
        if old != new and not (existing.type == "json" and new_type.name == LIST):  # JSON arrays of earlier versions
            if (old, new) not in _PROMOTIONS:
                raise TypeChangeError(
                    f"{target.name}: column {column.name} changed type from {old} to {new},"
                    " which DuckLake cannot read from the existing files",
                    hint=f"copy the table again with the new type: etl resync -c <pipeline file> --table {target.name}",
                )
            result.retypes.append((existing, new))
    result.drops = [c for i, c in enumerate(current) if i not in used]
    return result


def _signature(column: LakeColumn) -> str:
    """The column's type, with its list elements': ``list<int32>``."""
    return f"{LIST}<{_signature(column.element)}>" if column.element is not None else column.type
