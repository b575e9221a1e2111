"""Spark's Python workers load pyspark from the installed package, not from Spark's zip of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyspark

from etl_spark.python_daemon import installed_path
from etl_spark.session import SparkSettings, session_conf

LIB = Path(pyspark.__file__).parent / "python" / "lib"


def test_the_installed_packages_own_zips_leave_the_path_and_any_other_stays() -> None:
    own = [str(p) for p in sorted(LIB.glob("*.zip"))]
    assert any(p.endswith("pyspark.zip") for p in own) and any("py4j" in p for p in own)
    other, site = "/opt/spark/python/lib/pyspark.zip", str(Path(pyspark.__file__).parents[1])
    assert installed_path([*own, "/somewhere", other, site]) == ["/somewhere", other, site]


def test_without_an_installed_pyspark_the_zips_stay() -> None:
    assert installed_path([str(LIB / "pyspark.zip"), "/nowhere"]) == [str(LIB / "pyspark.zip"), "/nowhere"]


def test_local_masters_start_the_daemon_and_others_keep_sparks() -> None:
    assert session_conf(SparkSettings(master="local[2]"))["spark.python.daemon.module"] == "etl_spark.python_daemon"
    assert "spark.python.daemon.module" not in session_conf(SparkSettings(master="spark://cluster:7077"))


def test_a_tasks_python_imports_pyspark_and_py4j_from_the_installed_packages(spark: Any) -> None:
    import py4j

    files = (
        spark.sparkContext.parallelize([0], 1)
        .mapPartitions(lambda _: [(__import__("pyspark").__file__, __import__("py4j").__file__)])
        .collect()
    )
    assert files == [(pyspark.__file__, py4j.__file__)]
