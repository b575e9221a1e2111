"""How a lake table's columns must change to match a new source schema.

A lake column and a source column are the same column when they hold the same Postgres attribute
(``attnum``, which a rename keeps and the writer records per lake column), or, where either side does
not know it, when their names agree. Source columns left unmatched are then paired with lake columns
left unmatched at the same position among the unmatched, when their types agree and the attribute
numbers do not tell them apart: that is a rename (Postgres keeps a column's position when it renames
it). Everything else is a drop or an add; an add gets a new column id, never a reused one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from etl.errors import TableError
from etl.schema import ColumnSchema, TableSchema
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


def _may_be_same(lake: LakeColumn, column: ColumnSchema) -> bool:
    return lake.attnum is None or column.attnum is None or lake.attnum == column.attnum


def diff(current: tuple[LakeColumn, ...], target: TableSchema) -> SchemaDiff:
    result = SchemaDiff()
    by_attnum = {c.attnum: c for c in current if c.attnum is not None}
    by_name = {c.name: c for c in current}
    matched: dict[str, LakeColumn] = {}
    for column in target.columns:
        if column.attnum is not None and column.attnum in by_attnum:
            matched[column.name] = by_attnum[column.attnum]
    used = {c.column_id for c in matched.values()}
    for column in target.columns:
        lake = by_name.get(column.name)
        free = column.name not in matched and lake is not None and lake.column_id not in used
        if free and lake is not None and _may_be_same(lake, column):
            matched[column.name] = lake
            used.add(lake.column_id)
    new_unmatched = [c for c in target.columns if c.name not in matched]
    old_unmatched = [c for c in current if c.column_id not in used]
    if len(new_unmatched) == len(old_unmatched):
        for new, old in zip(new_unmatched, old_unmatched, strict=True):
            if lake_type(new).name == old.type and _may_be_same(old, new):
                matched[new.name] = old
                used.add(old.column_id)
    for column in target.columns:
        existing = matched.get(column.name)
        if existing is None:
            result.adds.append(NewColumn(column.name, lake_type(column), column.nullable))
            continue
        if existing.name != column.name:
            result.renames.append((existing, column.name))
        new_type = lake_type(column).name
        if existing.type != new_type:
            if (existing.type, new_type) not in _PROMOTIONS:
                raise TableError(
                    f"{target.name}: column {column.name} changed type from {existing.type} to {new_type},"
                    " which DuckLake cannot read from the existing files",
                    hint="resync the table (etl resync) to copy it again with the new type",
                )
            result.retypes.append((existing, new_type))
    result.drops = [c for c in current if c.column_id not in used]
    return result
