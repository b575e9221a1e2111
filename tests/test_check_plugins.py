"""`etl check` on the store and destination sections, for the plugins this project ships: their options' errors
and the preflight checks that open what the run will open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from etl.checks import run_checks
from etl.config import load_config
from etl.errors import ConfigError
from etl.factory import validate_plugins
from etl.testing import free_port
from etl.testing.pytest_plugin import TestDatabase

PIPELINE = """
[pipeline]
id = 1
publication = "pub"
[source]
host = "127.0.0.1"
port = 1
user = "postgres"
connect_timeout = 2
[destination]
type = "ducklake"
catalog = "sqlite:////tmp/catalog.sqlite"
data_path = "/tmp/lake/"
"""


def config_with(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(PIPELINE + line + "\n")
    return path


def test_an_unknown_key_like_no_other_lists_the_keys_of_its_section(tmp_path: Path) -> None:
    path = config_with(tmp_path, "zzz = 1")
    with pytest.raises(ConfigError) as err:
        validate_plugins(load_config(path), str(path))
    assert "destination.zzz: unknown key; the keys here are catalog, data_path, spark," in err.value.message


def test_check_points_a_destination_section_at_its_guide(tmp_path: Path) -> None:
    """A mistyped key says what was meant, and the fix names the destination's own guide."""
    path = config_with(tmp_path, "catalgo = 'x'")
    (destination,) = [c for c in run_checks(load_config(path), str(path)) if c.name == "destination"]
    assert 'destination.catalgo: unknown key; did you mean "catalog"?' in destination.detail
    assert destination.fix == "fix the section, see docs/destinations/ducklake.md"


def test_check_opens_what_the_run_would_and_fails_where_it_would(pg_database: TestDatabase, tmp_path: Path) -> None:
    """A store file in a missing directory, an unreachable catalog, a data path under a file and a broken Java
    each fail `etl check`, as each would fail `etl run`; the source's own checks pass."""
    db = pg_database
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    (tmp_path / "file").write_text("")
    path = tmp_path / "pipeline.toml"
    path.write_text(
        f'[pipeline]\nid = 1\npublication = "pub"\n'
        f'[source]\nhost = "127.0.0.1"\nport = {db.cluster.port}\ndatabase = "{db.name}"\nuser = "postgres"\n'
        f'sslmode = "disable"\n[store]\ntype = "sqlite"\npath = "{tmp_path}/missing/state.sqlite"\n'
        f'[destination]\ntype = "ducklake"\ncatalog = "postgresql://lake@127.0.0.1:{free_port()}/lake"\n'
        f'data_path = "{tmp_path}/file/lake/"\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "etl.cli", "check", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "JAVA_HOME": str(tmp_path / "no-java")},
    )
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line.split(":", 1)[0] for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert failed == ["FAIL  store file", "FAIL  ducklake catalog", "FAIL  ducklake data path", "FAIL  java"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "pipeline.toml"]  # nothing created


def test_a_bigquery_dataset_of_the_wrong_form_says_the_form(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(
        PIPELINE.split("[destination]", maxsplit=1)[0]
        + '[destination]\ntype = "bigquery"\nproject = "p"\ndataset = "my-data"\nstaging_uri = "gs://b/etl"\n'
    )
    with pytest.raises(ConfigError) as err:
        validate_plugins(load_config(path), str(path))
    expected = "expected letters, digits and _ only, at most 1,024 of them, for example analytics"
    assert f"  destination.dataset: {expected}" in err.value.message


@pytest.mark.first_major  # Spark's start and a job do not depend on the source's major
def test_check_deep_runs_a_spark_job_where_the_run_would(pg_database: TestDatabase, tmp_path: Path) -> None:
    """`etl check --deep` starts the destination's Spark session and runs a job: it passes with a working master,
    and fails, with the fix, on one Spark cannot start; without --deep no Spark line is printed."""
    db = pg_database
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")

    def check(master: str, *options: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "pipeline.toml"
        path.write_text(
            f'[pipeline]\nid = 1\npublication = "pub"\n'
            f'[source]\nhost = "127.0.0.1"\nport = {db.cluster.port}\ndatabase = "{db.name}"\nuser = "postgres"\n'
            f'sslmode = "disable"\n[destination]\ntype = "ducklake"\ncatalog = "sqlite:///{tmp_path}/catalog.sqlite"\n'
            f'data_path = "{tmp_path}/lake/"\n[destination.spark]\nmaster = "{master}"\n'
        )
        return subprocess.run(
            [sys.executable, "-m", "etl.cli", "--log-level", "error", "check", "-c", str(path), *options],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    shallow = check("local[1]")
    assert shallow.returncode == 0 and "spark:" not in shallow.stdout, shallow.stdout
    deep = check("local[1]", "--deep")
    assert deep.returncode == 0, deep.stdout + deep.stderr
    assert "PASS  spark: Spark 4." in deep.stdout and "a job of two tasks ran" in deep.stdout, deep.stdout
    broken = check("local[0]", "--deep")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    (line,) = [x for x in broken.stdout.splitlines() if x.startswith("FAIL")]
    assert line.startswith("FAIL  spark: Spark did not start with master 'local[0]'"), broken.stdout
    assert "fix: check the spark.master setting" in broken.stdout
