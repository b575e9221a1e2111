"""The DuckLake catalog, in SQLite or Postgres through SQLAlchemy: bootstrap, reads, and snapshot commits.

One ``commit`` is one catalog transaction and one DuckLake snapshot. Ids come from the latest
snapshot read inside the transaction; the primary key on ``ducklake_snapshot.snapshot_id`` is the
commit point, so a concurrent writer (another pipeline, DuckDB compacting) makes one of the two
fail and retry. A commit whose inputs were computed against an older snapshot first checks that no
snapshot since then touched its tables other than by plain inserts, and raises ``CommitConflict``
otherwise, so the caller recomputes. The replication watermark lives in this writer's own table in
the same database and moves in the same transaction.

Modules: ``model`` (the values), ``engine`` (catalog URLs), ``ddl`` (the tables), ``migrations`` (this
writer's tables over versions), ``bootstrap`` (a new lake), ``column_ids`` (how columns are numbered),
``inlined`` (rows kept in the catalog), ``reads`` (``Catalog``) and ``transaction`` (``Transaction``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etl_spark.ducklake.catalog.column_ids import ColumnIds, assign_column_ids
    from etl_spark.ducklake.catalog.engine import engine_for, redacted
    from etl_spark.ducklake.catalog.model import (
        UNKNOWN_SOURCE_TYPE,
        Composed,
        DataFile,
        DeleteFile,
        Handle,
        InlinedFlush,
        LakeColumn,
        LakeOptions,
        LakeTable,
        NewColumn,
        NewFile,
        Placed,
        SourceColumn,
        inside,
    )
    from etl_spark.ducklake.catalog.reads import Catalog
    from etl_spark.ducklake.catalog.transaction import CommitConflict, Transaction

_HOMES: dict[str, str] = {
    "Catalog": "reads",
    "ColumnIds": "column_ids",
    "CommitConflict": "transaction",
    "Composed": "model",
    "DataFile": "model",
    "DeleteFile": "model",
    "Handle": "model",
    "InlinedFlush": "model",
    "LakeColumn": "model",
    "LakeOptions": "model",
    "LakeTable": "model",
    "NewColumn": "model",
    "NewFile": "model",
    "Placed": "model",
    "SourceColumn": "model",
    "Transaction": "transaction",
    "UNKNOWN_SOURCE_TYPE": "model",
    "assign_column_ids": "column_ids",
    "engine_for": "engine",
    "inside": "model",
    "redacted": "engine",
}

__all__ = [
    "UNKNOWN_SOURCE_TYPE",
    "Catalog",
    "ColumnIds",
    "CommitConflict",
    "Composed",
    "DataFile",
    "DeleteFile",
    "Handle",
    "InlinedFlush",
    "LakeColumn",
    "LakeOptions",
    "LakeTable",
    "NewColumn",
    "NewFile",
    "Placed",
    "SourceColumn",
    "Transaction",
    "assign_column_ids",
    "engine_for",
    "inside",
    "redacted",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # once: later look-ups find it without this function
    return value
