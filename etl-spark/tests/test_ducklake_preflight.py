"""`etl check` for the DuckLake destination: the catalog and the data path, opened as the run opens them,
with nothing created."""

from __future__ import annotations

from pathlib import Path

from etl.testing import free_port
from etl.testing.pytest_plugin import TestDatabase
from etl_spark.ducklake.preflight import catalog_check, data_path_checks


def test_a_reachable_postgres_catalog_passes(pg_database: TestDatabase) -> None:
    url = f"postgresql://postgres@127.0.0.1:{pg_database.cluster.port}/{pg_database.name}"
    check = catalog_check(url)
    assert check.ok, check.detail


def test_an_unreachable_postgres_catalog_fails_without_showing_its_password() -> None:
    port = free_port()
    check = catalog_check(f"postgresql://lake:s3cret@127.0.0.1:{port}/lake")
    assert not check.ok
    assert f"cannot connect to postgresql://lake:***@127.0.0.1:{port}/lake" in check.detail
    assert "s3cret" not in check.detail + str(check.fix)


def test_a_sqlite_catalog_in_a_missing_directory_fails(tmp_path: Path) -> None:
    check = catalog_check(f"sqlite:///{tmp_path}/missing/catalog.sqlite")
    assert not check.ok
    assert check.detail == f"the directory {tmp_path}/missing does not exist"


def test_a_sqlite_catalog_to_create_passes_and_is_not_created(tmp_path: Path) -> None:
    check = catalog_check(f"sqlite:///{tmp_path}/catalog.sqlite")
    assert check.ok, check.detail
    assert list(tmp_path.iterdir()) == []


def test_a_data_path_under_a_file_fails(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    (check,) = data_path_checks(f"{tmp_path}/file/lake/")
    assert not check.ok
    assert check.detail == f"{tmp_path}/file is a file, so {tmp_path}/file/lake cannot be a directory"


def test_a_data_path_to_create_passes_and_nothing_is_left(tmp_path: Path) -> None:
    """The probe file is removed, and the missing directories are left for the run to create."""
    (check,) = data_path_checks(f"file://{tmp_path}/lake/data/")
    assert check.ok, check.detail
    assert check.detail == f"{tmp_path}/lake/data will be created under {tmp_path}, which is writable"
    assert list(tmp_path.iterdir()) == []


def test_a_remote_data_path_is_left_to_the_run() -> None:
    assert data_path_checks("s3://bucket/lake/") == []
