"""How a lake table's columns must change to match a new source schema.

Columns are matched by name. Source columns left unmatched are paired with lake columns left
unmatched at the same position among the unmatched, when their types agree: that is a rename
(Postgres keeps a column's position when it renames it). Everything else is a drop or an add; an add
gets a new column id, never a reused one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etl.errors import TableError
from etl.schema import TableSchema
from etl_spark.ducklake.catalog import LakeColumn, NewColumn
from etl_spark.ducklake.types import lake_type

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
    by_name = {c.name: c for c in current}
    wanted = {c.name for c in target.columns}
    new_unmatched = [c for c in target.columns if c.name not in by_name]
    old_unmatched = [c for c in current if c.name not in wanted]
    for column in target.columns:
        existing = by_name.get(column.name)
        if existing is None:
            continue
        new_type = lake_type(column).name
        if existing.type != new_type:
            if (existing.type, new_type) not in _PROMOTIONS:
                raise TableError(
                    f"{target.name}: column {column.name} changed type from {existing.type} to {new_type},"
                    " which DuckLake cannot read from the existing files",
                    hint="resync the table (etl resync) to copy it again with the new type",
                )
            result.retypes.append((existing, new_type))
    renamed: set[str] = set()
    if len(new_unmatched) == len(old_unmatched):
        for new, old in zip(new_unmatched, old_unmatched, strict=True):
            if lake_type(new).name == old.type:
                result.renames.append((old, new.name))
                renamed.add(new.name)
    renamed_old = {old.column_id for old, _ in result.renames}
    result.drops = [c for c in old_unmatched if c.column_id not in renamed_old]
    result.adds = [NewColumn(c.name, lake_type(c), c.nullable) for c in new_unmatched if c.name not in renamed]
    return result
