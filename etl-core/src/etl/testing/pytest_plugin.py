"""pytest fixtures: a throwaway Postgres cluster per session and major, a fresh database per test.

Under pytest-xdist each worker process has its own clusters (and its own Spark session, for etl-spark's
tests). A test marked ``alone`` runs while no other worker runs a test: for tests that measure time,
which a neighbour's load would make flaky.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Generator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psycopg
import pytest

from etl.config import PostgresConnection
from etl.demo_postgres import find_install, find_installs
from etl.schema import quote_ident
from etl.testing.clusters import TemporaryCluster

_counter = itertools.count()

pytest.register_assert_rewrite("etl.testing.store_contract")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pg-major",
        action="append",
        type=int,
        default=None,
        help="Postgres major version to run database tests on (repeatable; env ETL_TEST_PG_MAJORS=15,18)",
    )


_LOCK_DIR = "etl_lock_dir"  # the workerinput key
_lock_dir = pytest.StashKey[Path]()  # the controller's


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "alone: run while no other test runs (under pytest-xdist): the test measures time"
    )
    if getattr(config, "workerinput", None) is None and getattr(config.option, "dist", "no") != "no":
        config.stash[_lock_dir] = Path(tempfile.mkdtemp(prefix="etl-tests-"))  # pytest-xdist's controller


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller hands each worker the directory of the locks they share."""
    node.workerinput[_LOCK_DIR] = str(node.config.stash[_lock_dir])


def pytest_unconfigure(config: pytest.Config) -> None:
    lock_dir = config.stash.get(_lock_dir, None)
    if lock_dir is not None:
        shutil.rmtree(lock_dir, ignore_errors=True)


def _flock(files: ExitStack, path: Path, mode: int) -> IO[str]:
    handle = files.enter_context(path.open("a"))
    fcntl.flock(handle, mode)
    return handle


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Under xdist, hold the run lock shared for a test's setup, call and teardown; exclusively for an ``alone``
    test.

    A writer-first lock from two ``flock`` files: every test passes the gate to take the run lock, and an
    ``alone`` test keeps the gate until it ends, so the other workers wait for it rather than starve it.
    """
    workerinput: dict[str, Any] | None = getattr(item.config, "workerinput", None)
    if workerinput is None or _LOCK_DIR not in workerinput:
        return (yield)
    lock_dir = Path(workerinput[_LOCK_DIR])
    alone = item.get_closest_marker("alone") is not None
    with ExitStack() as files:
        gate = _flock(files, lock_dir / "gate", fcntl.LOCK_EX)
        _flock(files, lock_dir / "run", fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        return (yield)


def _majors(config: pytest.Config) -> list[int]:
    majors: list[int] | None = config.getoption("--pg-major")
    if majors:
        return majors
    env = os.environ.get("ETL_TEST_PG_MAJORS", "").strip()
    if env:
        return [int(m) for m in env.split(",") if m.strip()]
    installs = find_installs()
    return [installs[0].major] if installs else [0]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pg_major" in metafunc.fixturenames:
        majors = _majors(metafunc.config)
        metafunc.parametrize("pg_major", majors, scope="session", ids=[f"pg{m}" for m in majors])


def first_major_only(
    config: pytest.Config, items: list[pytest.Item], repeats: Callable[[pytest.Item, dict[str, Any]], bool]
) -> None:
    """Deselect the items for which ``repeats(item, params)`` holds that run with a later Postgres major than
    the first one collected: for tests whose outcome does not depend on the major. Call it from a
    ``pytest_collection_modifyitems`` hook."""

    def params(item: pytest.Item) -> dict[str, Any]:
        return dict(getattr(getattr(item, "callspec", None), "params", {}))

    first = min((params(i)["pg_major"] for i in items if "pg_major" in params(i)), default=None)
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        p = params(item)
        later = p.get("pg_major", first) != first
        (drop if later and repeats(item, p) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def _postgres_clusters() -> Iterator[dict[int, TemporaryCluster]]:
    """The session's running clusters by major, stopped at its end. Not ``postgres_cluster``'s own: pytest stops
    a session fixture of the parametrized major whenever the tests turn to another major, and starts it again
    when they turn back."""
    clusters: dict[int, TemporaryCluster] = {}
    try:
        yield clusters
    finally:
        with ExitStack() as stops:  # every one, even when one fails to stop
            for cluster in clusters.values():
                stops.callback(cluster.stop)


@pytest.fixture(scope="session")
def postgres_cluster(pg_major: int, _postgres_clusters: dict[int, TemporaryCluster]) -> TemporaryCluster:
    """A running cluster (wal_level=logical, trust auth, loopback) shared by the session's tests of its major,
    started by the first of them."""
    cluster = _postgres_clusters.get(pg_major)
    if cluster is None:
        cluster = _postgres_clusters[pg_major] = TemporaryCluster(find_install(pg_major or None)).start()
    return cluster


@dataclass
class TestDatabase:
    """A fresh database on the session's cluster."""

    __test__ = False  # not a test class

    cluster: TemporaryCluster
    name: str

    @property
    def major(self) -> int:
        return self.cluster.major

    def connection(self, user: str = "postgres") -> PostgresConnection:
        return self.cluster.connection(self.name, user)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        return self.cluster.connect(self.name, **kwargs)

    def kept_connection(self) -> psycopg.Connection[Any]:
        """The calling thread's connection to the database kept across calls, in autocommit: for one-off
        statements and polls (``TemporaryCluster.kept_connection``)."""
        return self.cluster.kept_connection(self.name)

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement in autocommit (on the kept connection); return its rows (empty when it returns
        none)."""
        cur = self.kept_connection().execute(sql, params)
        return cur.fetchall() if cur.description else []

    def text_collation(self) -> str:
        """A text collation whose order is not the bytes' where the server has one: ICU's root (``und-x-icu``),
        else a libc locale's; else ``C`` (a server built without ICU, on a machine without locales, has no
        other). Quoted, for ``COLLATE``."""
        found = self.execute(
            "SELECT collname FROM pg_collation WHERE collname IN ('und-x-icu', 'en_US.utf8', 'en_US.UTF-8')"
            " AND collencoding IN (-1, pg_char_to_encoding('UTF8')) ORDER BY collprovider DESC LIMIT 1"
        )
        return quote_ident(found[0][0]) if found else '"C"'


@pytest.fixture
def pg_database(postgres_cluster: TemporaryCluster) -> Iterator[TestDatabase]:
    name = f"etl_test_{os.getpid()}_{next(_counter)}"
    postgres_cluster.create_database(name)
    try:
        yield TestDatabase(postgres_cluster, name)
    finally:
        postgres_cluster.drop_database(name)
