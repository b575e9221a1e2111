"""A lake as the planning code sees it: its catalog, its files, and the Spark session that works on them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from etl.api import COMMIT_LSN_COLUMN, OLD_COLUMN, TX_ORDINAL_COLUMN
from etl_spark.collapse import PRIOR_KEY
from etl_spark.ducklake.catalog import Catalog, LakeColumn, LakeOptions, LakeTable
from etl_spark.ducklake.parquet_files import DataFileSpec, ParquetOptions
from etl_spark.ducklake.storage import LakeStorage
from etl_spark.ducklake.types import Form, convert

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class Lake:
    catalog: Catalog
    storage: LakeStorage
    session: Callable[[], SparkSession]
    """The Spark session, started on first use (a batch that needs no Spark work starts none)."""
    target_file_size_bytes: int
    """Data files are closed at about this size."""
    options: LakeOptions
    """The lake's options, as read when the destination started."""
    staging: Callable[[DataFileSpec, int | None], None] | None = None
    """Told of each write job's files (its spec, the lake table's id) before they are written: an open
    transaction's parts record them (``open_transaction``)."""

    @property
    def spark(self) -> SparkSession:
        return self.session()

    def spec(
        self,
        directory: str,
        columns: Sequence[LakeColumn],
        schema_name: str,
        table_id: int | None,
        target_size_bytes: int = 0,
    ) -> DataFileSpec:
        """How to write data files of a table (``table_id`` ``None``: one its commit creates) into ``directory``:
        encoded as its options ask, closed at ``target_size_bytes`` (0: the lake's ``target_file_size_bytes``)."""
        parquet = ParquetOptions.of(self.options.of_table(schema_name, table_id))
        spec = self.storage.spec(directory, columns, target_size_bytes or self.target_file_size_bytes, parquet)
        if self.staging is not None:
            self.staging(spec, table_id)
        return spec

    def table_spec(self, table: LakeTable, columns: Sequence[LakeColumn], target_size_bytes: int) -> DataFileSpec:
        """``spec`` for files of a lake table as it stands, in its directory."""
        return self.spec(table.directory, columns, table.schema_name, table.table_id, target_size_bytes)

    def to_spark(self, table: pa.Table, columns: Sequence[LakeColumn]) -> DataFrame:
        """Rows or changes (``etl.events`` columns) as a Spark frame, row columns in their Spark form."""
        by_name = {c.name: c for c in columns}
        arrays: list[pa.Array | pa.ChunkedArray] = []
        for name in table.column_names:
            values = table[name]
            if name in by_name:
                values = convert(values, by_name[name], Form.SPARK)
            elif name in (OLD_COLUMN, PRIOR_KEY):
                values = _convert_struct(values.combine_chunks(), by_name)
            elif name in (COMMIT_LSN_COLUMN, TX_ORDINAL_COLUMN):
                values = pc.cast(values, pa.int64())
            arrays.append(values)
        return self.spark.createDataFrame(pa.table(arrays, names=table.column_names))


def _convert_struct(values: pa.StructArray, columns: dict[str, LakeColumn]) -> pa.StructArray:
    children = [convert(values.field(i), columns[f.name], Form.SPARK) for i, f in enumerate(values.type)]
    mask = pc.invert(values.is_valid()) if values.null_count else None
    return pa.StructArray.from_arrays(children, names=[f.name for f in values.type], mask=mask)
