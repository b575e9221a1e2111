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

Each name loads from its home module when first used (PEP 562, as ``etl.api``'s do): the modules Spark's tasks
import take the values (``model``) without SQLAlchemy and the catalog's reads. Type checkers read the imports below.
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
    "Catalog": "etl_spark.ducklake.catalog.reads",
    "ColumnIds": "etl_spark.ducklake.catalog.column_ids",
    "CommitConflict": "etl_spark.ducklake.catalog.transaction",
    "Composed": "etl_spark.ducklake.catalog.model",
    "DataFile": "etl_spark.ducklake.catalog.model",
    "DeleteFile": "etl_spark.ducklake.catalog.model",
    "Handle": "etl_spark.ducklake.catalog.model",
    "InlinedFlush": "etl_spark.ducklake.catalog.model",
    "LakeColumn": "etl_spark.ducklake.catalog.model",
    "LakeOptions": "etl_spark.ducklake.catalog.model",
    "LakeTable": "etl_spark.ducklake.catalog.model",
    "NewColumn": "etl_spark.ducklake.catalog.model",
    "NewFile": "etl_spark.ducklake.catalog.model",
    "Placed": "etl_spark.ducklake.catalog.model",
    "SourceColumn": "etl_spark.ducklake.catalog.model",
    "Transaction": "etl_spark.ducklake.catalog.transaction",
    "UNKNOWN_SOURCE_TYPE": "etl_spark.ducklake.catalog.model",
    "assign_column_ids": "etl_spark.ducklake.catalog.column_ids",
    "engine_for": "etl_spark.ducklake.catalog.engine",
    "inside": "etl_spark.ducklake.catalog.model",
    "redacted": "etl_spark.ducklake.catalog.engine",
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


# The same two functions as etl.api's: a plugin may import etl.api and etl.testing only (the import contract), and
# neither offers them.
def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: later look-ups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
