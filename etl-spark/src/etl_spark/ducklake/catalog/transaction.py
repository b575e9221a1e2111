"""The inside of one snapshot commit: schema, table, column and file changes, and the watermark.

``snapshot_commit`` holds what every change builds on (ids, change tokens, the pipeline's state rows and the
snapshot row ``finish`` writes), ``table_changes`` DuckLake's DDL, ``file_changes`` the data.
"""

from __future__ import annotations

from etl_spark.ducklake.catalog.file_changes import FileChanges
from etl_spark.ducklake.catalog.snapshot_commit import CatalogReads, CommitConflict
from etl_spark.ducklake.catalog.table_changes import TableChanges

__all__ = ["CatalogReads", "CommitConflict", "Transaction"]


class Transaction(TableChanges, FileChanges):
    """The inside of one snapshot commit; ids are allocated from the latest snapshot."""
