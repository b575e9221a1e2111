"""The ``[destination]`` keys of ``type = "ducklake"``, and the Spark settings its session adds."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from etl.api import ConfigError, Integer
from etl_spark.ducklake.catalog import engine_for
from etl_spark.ducklake.maintenance import MaintenanceConfig
from etl_spark.session import SparkSettings

SPARK_CONF = {"spark.sql.parquet.fieldId.read.enabled": "true", "spark.scheduler.mode": "FAIR"}
"""Field ids pick the columns of the files read; the fair scheduler runs the Spark jobs of a batch's tables,
planned on threads of their own, side by side."""


class DuckLakeConfig(BaseModel):
    """``[destination]`` keys of ``type = "ducklake"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    catalog: SecretStr = Field(
        description="`sqlite:////absolute/path/catalog.sqlite` (an absolute path: four slashes) or a `postgresql://`"
        " URL (psycopg 3). Treated as a secret: never logged; messages show it with the password masked. An empty"
        " database becomes a new lake, unless the store says tables were copied (then the start stops); a lake"
        " DuckDB created is used as it is."
    )
    data_path: str = Field(
        min_length=1,
        description="Absolute path or URI where data files live; must equal the lake's `data_path` when the catalog"
        " exists.",
    )
    spark: SparkSettings = Field(
        default_factory=SparkSettings,
        description="The section `[destination.spark]`: the Spark session; its keys follow.",
    )
    target_file_size_bytes: Integer = Field(
        512 * 1024 * 1024,
        ge=1024 * 1024,
        description="A data file is closed at about this many Parquet bytes and the next one started (a copy writes"
        " at least one file per task that copied rows).",
    )
    driver_copy_max_bytes: Integer = Field(
        4 * 1024 * 1024,
        ge=0,
        description="A table of at most this size (TOAST included) when its copy starts is copied on the driver, into"
        " one data file, without a Spark job: a small table is in the lake before Spark has started (see [Copies of"
        " small tables](#copies-of-small-tables)); 0 copies every table with Spark.",
    )
    commit_attempts: Integer = Field(
        10, ge=1, description="How often a batch is recomputed when another writer commits a conflicting change."
    )
    inline_row_limit: Integer = Field(
        10_000,
        ge=0,
        description="A batch inlines at most this many rows into the catalog, over all its tables, instead of writing"
        " them as data files: the tables with the fewest changes first (see [Data inlining](#data-inlining)); 0 turns"
        " inlining off.",
    )
    key_cache_bytes: Integer = Field(
        128 * 1024 * 1024,
        ge=0,
        description="Data files' key columns and delete files' positions kept in the driver's memory for finding the"
        " stored rows of a batch's keys (a one-column key: 8 bytes a row for `bigint`; a deleted position: 16 bytes),"
        " the least recently used going first; 0 keeps none.",
    )
    inline_flush_rows: Integer = Field(
        100_000,
        ge=1,
        description="A table's inlined rows (live and ended) are flushed into a data file once there are this many.",
    )
    driver_flush_max_rows: Integer = Field(
        250_000,
        ge=0,
        description="A flush of at most this many inlined rows (live and ended) reads them from the catalog and writes"
        " their data file on the driver, without a Spark job (100,000 rows: about half a second, where a Spark task"
        " takes seconds, which a flush inside a batch makes the stream wait for); a larger one runs as a Spark task."
        " 0 flushes every table with Spark.",
    )
    inline_flush_seconds: Integer = Field(
        300,
        ge=1,
        description="A table's inlined rows are also flushed at the latest this long after a batch first inlined rows"
        " into it, even when no batch comes (a background thread, between batches).",
    )
    author: str = Field("etl", description="Recorded in `ducklake_snapshot_changes.author`.")
    planning_threads: Integer = Field(
        4,
        ge=1,
        description="Tables of one batch planned at the same time, each on its own thread, their Spark jobs side by"
        " side in Spark's fair scheduler (a pool per thread). The batch still commits in one snapshot.",
    )
    maintenance: MaintenanceConfig | None = Field(
        None,
        description="The section `[destination.maintenance]` turns on [maintenance while the pipeline"
        " runs](#maintenance); its keys follow.",
    )

    @field_validator("catalog")
    @classmethod
    def _catalog_url(cls, value: SecretStr) -> SecretStr:
        try:
            engine_for(value.get_secret_value()).dispose()
        except ConfigError as exc:
            raise ValueError(exc.message + f" ({exc.hint})") from None
        return value

    @field_validator("data_path")
    @classmethod
    def _data_path(cls, value: str) -> str:
        if "://" not in value and not value.startswith("/"):
            raise ValueError("data_path must be an absolute path or a URI (s3://..., file:///...)")
        return value if value.endswith("/") else value + "/"
