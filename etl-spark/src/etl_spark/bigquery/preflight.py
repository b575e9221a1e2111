"""``etl check``'s lines for the BigQuery destination: the dataset as the run opens it, a local staging
directory, and Java; with ``--deep``, a Spark job and a probe written into the staging location and removed.
And the check of the destination's own start that the dataset holds the tables the store says were copied.

Nothing is created: a missing dataset passes (the run creates it) with what that needs said.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from etl.api import Check, DestinationError, EtlError, Store, TableError, writable_directory
from etl_spark.bigquery.client import make_client
from etl_spark.bigquery.names import table_id
from etl_spark.session import delete_path, first_line, get_spark, java_check, spark_check

if TYPE_CHECKING:
    from etl_spark.bigquery.config import BigQueryConfig

API_TIMEOUT_S = 30.0
"""How long ``etl check`` waits for the BigQuery API, retries included."""


def dataset_check(config: BigQueryConfig) -> Check:
    from google.api_core import exceptions
    from google.api_core.retry import Retry
    from google.auth import exceptions as auth_exceptions

    name = "bigquery dataset"
    ref = f"{config.project}.{config.dataset}"
    try:
        dataset = make_client(config).get_dataset(ref, retry=Retry(timeout=API_TIMEOUT_S), timeout=API_TIMEOUT_S)
    except EtlError as exc:  # an unreadable key file
        return Check(name, False, exc.message, exc.hint)
    except exceptions.NotFound:
        return Check(
            name, True, f"{ref} does not exist yet: the run creates it in {config.location} (bigquery.datasets.create)"
        )
    except auth_exceptions.GoogleAuthError as exc:
        return Check(
            name,
            False,
            f"no usable credentials for BigQuery: {exc}",
            "set credentials_file to a service-account key, or GOOGLE_APPLICATION_CREDENTIALS",
        )
    except exceptions.GoogleAPICallError as exc:
        return Check(
            name,
            False,
            f"cannot read {ref}: {exc.message}",
            "check the project and that the credentials may read the dataset (bigquery.datasets.get)",
        )
    except Exception as exc:  # the API unreachable: a transport error, a timeout
        return Check(
            name, False, f"cannot reach BigQuery: {type(exc).__name__}: {exc}", "check the network (and `endpoint`)"
        )
    if dataset.location and dataset.location.upper() != config.location.upper():
        return Check(
            name,
            False,
            f"{ref} is in {dataset.location}, where the config says location = {config.location!r}",
            f'set location = "{dataset.location}": every job runs in the dataset\'s location',
        )
    return Check(name, True, f"{ref} exists, in {dataset.location or config.location}")


def preflight(config: BigQueryConfig) -> list[Check]:
    staging = (
        [writable_directory("bigquery staging", Path(config.staging_local_dir))] if config.staging_local_dir else []
    )
    return [dataset_check(config), *staging, java_check()]


def deep_preflight(config: BigQueryConfig, extra: dict[str, str]) -> list[Check]:
    """A Spark job, then a probe Spark writes where batches are staged (``staging_uri``, or ``staging_local_dir``)
    and removes, with the connector and credentials the run will use."""
    spark = spark_check(config.spark, extra)
    if not spark.ok:
        return [spark]
    session = get_spark(config.spark, extra)
    base = config.staging_local_dir.rstrip("/") if config.staging_local_dir else config.staging_uri
    probe = f"{base}/_etl_check_{uuid.uuid4().hex}"
    try:
        session.range(1).write.parquet(probe)
        delete_path(session, probe)
    except Exception as exc:
        return [
            spark,
            Check(
                "bigquery staging write",
                False,
                f"Spark cannot write into {base}: {type(exc).__name__}: {first_line(exc)}",
                "check the bucket, the GCS connector on Spark's classpath (spark.jars) and its credentials",
            ),
        ]
    return [spark, Check("bigquery staging write", True, f"Spark wrote and removed a probe in {base}")]


def check_holds_the_copies(config: BigQueryConfig, store: Store | None, tables: set[str]) -> None:
    """At the start: stop when the pipeline's store says tables were copied that the dataset (its ``tables``)
    does not have: it was deleted, or it is another dataset. Going on would create them empty, stream changes into
    them, and move the store's progress past the copied rows."""
    if store is None:
        return
    copied = {t for t, s in store.get_table_states().items() if s.kind.copied}
    names: dict[int, set[str]] = {}
    for schema in store.get_table_schemas():  # every name a table had: a renamed one may keep its old
        if schema.id in copied:
            try:
                names.setdefault(schema.id, set()).add(table_id(schema.name))
            except TableError:  # a name BigQuery refuses errors its table at its write, not the whole start
                continue
    missing = sorted(t for t in copied if t in names and not names[t] & tables)
    if missing:
        shown = ", ".join(sorted(min(names[t]) for t in missing[:10]))
        raise DestinationError(
            f"BigQuery dataset {config.project}.{config.dataset} has no table for {len(missing)} of the"
            f" {len(copied)} tables this pipeline's store says were copied into it ({shown}"
            f"{', ...' if len(missing) > 10 else ''}): it was deleted or emptied, or it is not the pipeline's",
            hint="point `dataset` at the pipeline's dataset; to copy every table again into this one instead, stop"
            " the pipeline and run etl reset --recopy -c <pipeline file>",
        )
