"""The ``postgres_cluster`` fixture of the etl pytest plugin: one cluster per session and major, however the tests'
majors alternate (pytest stops a session fixture of a parameter whenever the tests turn to another value), its files
in memory where there is room."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from etl.demo_postgres import find_installs
from etl.testing import clusters
from etl.testing.clusters import TemporaryCluster, cluster_directory

pytest_plugins = ["pytester"]

CONFTEST = """
def pytest_collection_modifyitems(items):
    # the majors alternate: each test's major differs from the one before
    seen = {}
    def turn(item):
        major = item.callspec.params["pg_major"]
        seen[major] = seen.get(major, -1) + 1
        return (seen[major], major)
    items.sort(key=turn)
"""

TESTS = """
import pytest

LOG = {log!r}


@pytest.mark.parametrize("i", range(3))
def test_cluster(postgres_cluster, pg_major, i):
    with postgres_cluster.connect("postgres") as conn:
        started = conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    with open(LOG, "a") as log:
        log.write(f"{{pg_major}} {{postgres_cluster.port}} {{started.isoformat()}}\\n")
"""


def test_each_major_has_one_cluster_however_the_tests_alternate(pytester: pytest.Pytester) -> None:
    majors = sorted({install.major for install in find_installs()})[:2]
    if len(majors) < 2:
        pytest.skip("needs two Postgres majors installed")
    log = pytester.path / "log.txt"
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_clusters=TESTS.format(log=str(log)))
    majors_args = [arg for major in majors for arg in ("--pg-major", str(major))]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0", *majors_args)
    result.assert_outcomes(passed=6)
    runs = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert [major for major, _ in runs] == [str(m) for m in majors] * 3  # they alternated
    for major in majors:
        assert len({cluster for m, cluster in runs if m == str(major)}) == 1, f"Postgres {major} started again"


def test_clusters_keep_their_files_in_memory_when_there_is_room(
    postgres_cluster: TemporaryCluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """/dev/shm with room, unless ETL_TEST_PG_DIR names a directory; /tmp when /dev/shm is missing or small."""
    monkeypatch.delenv("ETL_TEST_PG_DIR", raising=False)
    assert postgres_cluster.datadir is not None and postgres_cluster.datadir.is_relative_to(cluster_directory())
    if shutil.disk_usage("/dev/shm").free >= clusters.SHM_ROOM:
        assert cluster_directory() == Path("/dev/shm")
    monkeypatch.setattr(clusters, "SHM_ROOM", 1 << 60)
    assert cluster_directory() == Path("/tmp")
    monkeypatch.setattr(clusters, "SHM_ROOM", 0)
    monkeypatch.setattr(clusters, "SHM", tmp_path / "missing")
    assert cluster_directory() == Path("/tmp")
    monkeypatch.setenv("ETL_TEST_PG_DIR", str(tmp_path))
    assert cluster_directory() == tmp_path
