"""The ``[destination]`` keys of ``type = "bigquery"``, and the Spark settings its session adds."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from etl.api import Integer
from etl_spark.session import SparkSettings

SPARK_CONF = {"spark.sql.parquet.compression.codec": "zstd"}


class BigQueryConfig(BaseModel):
    """``[destination]`` keys of ``type = "bigquery"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str = Field(
        min_length=1,
        description="Google Cloud project of the dataset; load and query jobs run (and are billed) here.",
    )
    dataset: str = Field(
        pattern=r"^[A-Za-z0-9_]{1,1024}$",
        json_schema_extra={"form": "letters, digits and _ only, at most 1,024 of them"},
        examples=["analytics"],
        description="Dataset id (letters, digits, `_`); created at startup when missing, in `location`.",
    )
    location: str = Field("US", min_length=1, description="Location of the dataset and of every job.")
    credentials_file: str | None = Field(
        None,
        description="A service-account JSON key. Without it: application default credentials"
        " (`GOOGLE_APPLICATION_CREDENTIALS`, `gcloud auth application-default login`, or the attached service"
        " account on GCE/GKE/Cloud Run). An unreadable key is a config error that names the file, never its content.",
    )
    staging_uri: str = Field(description="`gs://bucket[/prefix]` where batches are staged as Parquet for load jobs.")
    staging_local_dir: str | None = Field(
        None,
        description="A local directory that *is* the staging bucket (a local emulator serves it as `gs://bucket`);"
        " Spark writes there instead of `staging_uri`.",
    )
    endpoint: str | None = Field(
        None,
        description="BigQuery API endpoint override, for a local emulator; with it and no `credentials_file`,"
        " requests are sent without credentials.",
    )
    partition_by: dict[str, str] = Field(
        default_factory=dict,
        description='Per source table (`"schema.table"`), a date or timestamp column its target table is partitioned'
        " by, by day; applied when the target table is created.",
    )
    mode: Literal["apply", "history"] = Field(
        "apply",
        description='`"apply"`: each target table mirrors its source table. `"history"`: every change is appended as'
        " a row, deletes kept (see [History mode](#history-mode)).",
    )
    min_apply_interval_s: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="At least this long between the starts of two batch applies of one writer (the apply worker, a"
        " table's catch-up), unless the batch is full (`[batch] busy_max_bytes`). The engine merges what arrives"
        " meanwhile into the next batch, so each table gets at most one DML transaction, and the pipeline one load"
        " job, per interval; it is also about the latency (a change waits up to the interval). `0` applies every"
        " batch as it comes. See [Quotas](#quotas).",
    )
    api_retry_seconds: Integer = Field(
        120,
        ge=1,
        description="How long the BigQuery client retries a failing call itself (429, 5xx, dropped connections);"
        " after that the failure goes to the engine, which retries the batch with backoff.",
    )
    spark: SparkSettings = Field(
        default_factory=SparkSettings,
        description="The section `[destination.spark]`: the Spark session, shared with the `ducklake` destination"
        " (see [ducklake.md](ducklake.md#config-keys)); its keys follow.",
    )

    @field_validator("staging_uri")
    @classmethod
    def _staging(cls, value: str) -> str:
        if not value.startswith("gs://") or len(value) <= len("gs://"):
            raise ValueError("staging_uri must be gs://bucket[/prefix]")
        return value.rstrip("/")
