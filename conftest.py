"""Suite-wide pytest hooks of this repository (not shipped: plugin authors get ``etl.testing`` only)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from etl_spark.bigquery.emulator import BigQueryEmulator


def pytest_configure(config: pytest.Config) -> None:
    """Every JVM of the run (Spark drivers and executors, in tests and in the `etl run` processes they start)
    maps one class-data archive of Spark's classes: a JVM start is most of the suite's CPU, and the archive
    halves it (``etl_spark.class_archive``). Made once per Java, Spark and options, before the workers start;
    they inherit the environment."""
    if hasattr(config, "workerinput"):
        return
    from etl_spark.class_archive import ensure_archive, java_options

    archive = ensure_archive(Path(tempfile.gettempdir()) / "etl-test-jvm")
    os.environ["JDK_JAVA_OPTIONS"] = f"{os.environ.get('JDK_JAVA_OPTIONS', '')} {java_options(archive)}".strip()


@pytest.fixture(scope="session")
def bigquery_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigQueryEmulator]:
    """One local BigQuery server (local-bigquery 0.4.0, loopback) per test process, for etl-spark's tests and the
    end-to-end ones alike; tests use datasets of their own."""
    from etl_spark.bigquery.emulator import running_emulator

    with running_emulator(tmp_path_factory.mktemp("bigquery")) as server:
        yield server


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first, in their order, then the rest: pytest-xdist hands tests out in this order,
    so the longest start while every worker is free instead of running on alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
