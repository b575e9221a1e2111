"""How DuckLake numbers a table's columns: depth-first pre-order, each list's element right after its list.

DuckDB 1.5.5 records ``CREATE TABLE t (a INT, tags VARCHAR[], m INT[][], b INT)`` as ``ducklake_column``
rows (column_id, name, type, parent_column): (1, a, int32), (2, tags, list), (3, element, varchar, 2),
(4, m, list), (5, element, list, 4), (6, element, int32, 5), (7, b, int32). Column orders follow the same
walk. Data files carry these ids as Parquet field ids, list elements included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from etl_spark.ducklake.catalog.model import NewColumn
from etl_spark.ducklake.types import LakeType

ELEMENT: Final = "element"
"""The name DuckDB gives a list's element column."""


@dataclass(frozen=True)
class ColumnIds:
    """The id of a column and, for a list, the ids of its element."""

    column_id: int
    element: ColumnIds | None = None

    def __iter__(self) -> Iterator[int]:
        """Every id, the column's first (pre-order)."""
        ids: ColumnIds | None = self
        while ids is not None:
            yield ids.column_id
            ids = ids.element


def assign_column_ids(columns: Sequence[NewColumn], start: int = 1) -> list[ColumnIds]:
    """The ids DuckLake gives ``columns`` (one ``ColumnIds`` each, in order), numbered from ``start``.

    ``Transaction.create_table`` numbers a new table's columns this way from 1, and ``Transaction.add_column``
    a column from the id it is given (above every id the table used: ``Catalog.max_column_id`` + 1). Planning
    code calls this to know the ids, list elements' included, before the commit.
    """
    result = []
    next_id = start
    for column in columns:
        ids = _ids(column.type, next_id)
        result.append(ids)
        next_id += len(list(ids))
    return result


def _ids(lake_type: LakeType, column_id: int) -> ColumnIds:
    element = None if lake_type.element is None else _ids(lake_type.element, column_id + 1)
    return ColumnIds(column_id, element)
