"""The class-data archive of Spark's classes: named after what it belongs to, made once, mapped by Spark's JVMs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from etl_spark.class_archive import archive_path, ensure_archive, java_options


def test_the_archive_is_named_after_the_jvm_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-XX:+UseSerialGC")
    serial = archive_path(tmp_path)
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-XX:+UseG1GC")
    assert archive_path(tmp_path) != serial, "an archive dumped under one collector is useless under another"
    assert archive_path(tmp_path).parent == tmp_path


def test_an_archive_already_made_is_used_as_it_is(tmp_path: Path) -> None:
    made = archive_path(tmp_path)
    made.write_bytes(b"made by an earlier run")
    assert ensure_archive(tmp_path) == made
    assert made.read_bytes() == b"made by an earlier run"


def test_the_suites_spark_driver_loads_spark_classes_from_the_archive(tmp_path: Path) -> None:
    """The root conftest made the archive and handed its options to every JVM of the run: a Spark driver started
    now loads SparkContext from it, not from its jar (else the suite's JVMs start on twice the CPU)."""
    options = os.environ.get("JDK_JAVA_OPTIONS", "")
    archive = re.search(r"-XX:SharedArchiveFile=(\S+)", options)
    assert archive is not None, "the suite's JVMs get no archive"
    assert options.endswith(java_options(Path(archive[1])))
    loads = tmp_path / "class-loads.log"
    start = (
        "from etl_spark.session import SparkSettings, get_spark, stop_spark;"
        "get_spark(SparkSettings(master='local[1]')).range(3).count(); stop_spark()"
    )
    env = os.environ | {"JDK_JAVA_OPTIONS": f"{options} -Xlog:class+load=info:file={loads}"}
    subprocess.run([sys.executable, "-c", start], env=env, check=True, capture_output=True, timeout=180)
    spark_context = [line for line in loads.read_text().splitlines() if "org.apache.spark.SparkContext " in line]
    assert spark_context, "the driver never loaded SparkContext"
    assert "source: shared objects file (top)" in spark_context[0]
