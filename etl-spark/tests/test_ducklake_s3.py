"""A lake whose data path is on S3: hostile table names write inside the data path's prefix, DuckDB reads them
back over S3, and the orphan sweep deletes only the lake's own files under it.

moto's S3 server, on loopback, stands in for AWS (the S3 API over HTTP; no network here); the destination
reaches it through pyarrow's S3 file system with ``AWS_ENDPOINT_URL``, as it would reach MinIO. The writes
here run on the driver, whose environment the test sets; Spark's tasks would need it at their JVM's start.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from moto.server import ThreadedMotoServer

from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.ducklake.maintenance import Maintenance, MaintenanceConfig
from etl_spark.ducklake.preflight import remote_data_path_check
from etl_spark.ducklake.reader import connect_duckdb

HOSTILE = [("public", "../../victim"), ("public", ".."), ("public", "a/b"), ("public", "/etc"), ("../..", "t")]


@dataclass
class S3Lake:
    url: str
    data_path: str
    bucket: str
    endpoint: str

    def fs(self) -> pafs.FileSystem:
        """The test's own view of the bucket (the destination finds the endpoint in ``AWS_ENDPOINT_URL``)."""
        return pafs.FileSystem.from_uri(f"s3://{self.bucket}/")[0]

    def keys(self) -> list[str]:
        selector = pafs.FileSelector(self.bucket, recursive=True)
        return sorted(i.path for i in self.fs().get_file_info(selector) if i.is_file)

    def query(self, sql: str) -> list[tuple[Any, ...]]:
        con = connect_duckdb("sqlite", "httpfs")
        try:
            host = self.endpoint.removeprefix("http://")
            con.execute(
                "CREATE SECRET s3 (TYPE s3, KEY_ID 'test', SECRET 'test', REGION 'us-east-1',"
                f" ENDPOINT '{host}', URL_STYLE 'path', USE_SSL false)"
            )
            con.execute(f"ATTACH 'ducklake:sqlite:{self.url.removeprefix('sqlite:///')}' AS lake (READ_ONLY)")
            return con.execute(sql).fetchall()
        finally:
            con.close()


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_lake(s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3Lake:
    for name, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    host = s3_endpoint.removeprefix("http://")
    pafs.S3FileSystem(endpoint_override=host, scheme="http", allow_bucket_creation=True).create_dir(bucket)
    return S3Lake(f"sqlite:///{tmp_path}/catalog.sqlite", f"s3://{bucket}/lake/", bucket, s3_endpoint)


def schema_of(number: int, schema: str, name: str) -> TableSchema:
    return TableSchema(
        17600 + number, TableName(schema, name), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("v", 25))
    )


def test_hostile_names_on_s3_stay_under_the_data_path_and_read_back(s3_lake: S3Lake, kit: Any) -> None:
    destination = kit.make_destination(s3_lake, inline_row_limit=0)
    for number, (schema, name) in enumerate(HOSTILE):
        rows = pa.table({"id": pa.array([number], pa.int32()), "v": pa.array([name])})
        destination.write_table_rows(schema_of(number, schema, name), rows)
    keys = s3_lake.keys()
    assert len(keys) == len(HOSTILE), keys
    assert all(key.startswith(f"{s3_lake.bucket}/lake/") and "/../" not in key for key in keys), keys
    for number, (schema, name) in enumerate(HOSTILE):
        quoted = '"' + schema.replace('"', '""') + '"."' + name.replace('"', '""') + '"'
        assert s3_lake.query(f"SELECT id, v FROM lake.{quoted}") == [(number, name)]


def test_the_orphan_sweep_on_s3_deletes_only_the_lakes_own_unregistered_files(s3_lake: S3Lake, kit: Any) -> None:
    destination = kit.make_destination(s3_lake, inline_row_limit=0)
    schema = schema_of(0, "public", "../../victim")
    destination.write_table_rows(schema, pa.table({"id": pa.array([1], pa.int32()), "v": pa.array(["kept"])}))
    (registered,) = s3_lake.keys()
    directory = registered.rsplit("/", 1)[0]
    fs = s3_lake.fs()
    orphan = f"{directory}/ducklake-{uuid.uuid4()}.parquet"
    others = [
        f"{directory}/important.conf",  # in the table's directory, not named as the lake's files are
        f"{s3_lake.bucket}/victim/ducklake-{uuid.uuid4()}.parquet",  # where the table's name points
        f"{s3_lake.bucket}/lake-other/ducklake-{uuid.uuid4()}.parquet",  # a prefix that only starts alike
    ]
    for key in (orphan, *others):
        with fs.open_output_stream(key) as out:
            out.write(b"not registered")

    # Every unregistered file counts as old (S3 keeps no settable times; the config's least age is a minute)
    Maintenance(MaintenanceConfig.model_construct(orphan_after_seconds=0), destination.metrics).orphans(
        destination.lake, copying=lambda: False
    )
    assert s3_lake.keys() == sorted([registered, *others])
    destination.lake.storage.delete(f"s3://{key}" for key in others)  # asked outright: still refused
    assert s3_lake.keys() == sorted([registered, *others])
    assert s3_lake.query('SELECT v FROM lake.public."../../victim"') == [("kept",)]


def test_check_deep_writes_a_probe_under_an_s3_data_path(s3_lake: S3Lake, tmp_path: Path) -> None:
    """`etl check --deep` proves the run can write where its data goes: a probe under the data path, removed; a
    bucket that is not there fails with the fix."""
    checks = remote_data_path_check(s3_lake.data_path)
    assert [(c.name, c.ok) for c in checks] == [("ducklake data path write", True)], checks
    assert s3_lake.keys() == []
    (missing,) = remote_data_path_check(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/lake/")
    assert not missing.ok and "cannot write into s3://no-such-bucket" in missing.detail, missing
    assert remote_data_path_check(f"{tmp_path}/lake/") == []  # a local path is etl check's own (preflight)
