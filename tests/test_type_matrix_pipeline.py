"""Every built-in type family through the initial copy and through streaming: same values both ways."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest

from etl.destination.memory import MemoryDestination
from etl.pipeline import Pipeline
from etl.store.memory import MemoryStore
from etl.testing.pipelines import all_ready, pipeline_config, wait_until
from etl.testing.pytest_plugin import TestDatabase

COLUMNS = """
    b bool, i2 int2, i4 int4, i8 int8, f4 float4, f8 float8, n numeric(12,3), nu numeric,
    t text, vc varchar(10), bp char(5), nm name, by bytea, d date, tm time, ttz timetz, ts timestamp,
    tstz timestamptz, iv interval, u uuid, j json, jb jsonb, ip inet, cd cidr, mac macaddr, m money, o oid,
    ai int4[], at text[], a2 int4[][], e mood, dm positive, bits bit varying(8)
"""

VALUES = [
    "(true, -32768, 2147483647, -9223372036854775808, 'NaN', '-Infinity', 123456789.125, 'NaN', 'héllo, \"w\"\n',"
    " 'short', 'ab', 'nm', '\\x00ff10', 'infinity', '23:59:59.999999', '12:30:00+05:30', '-infinity', 'infinity',"
    " '1 year 2 mons 3 days 04:05:06.789', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '{\"a\": [1, 2.50]}',"
    " '{\"b\": {\"c\": null}}', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03', 12.34, 4294967295,"
    " '{1,NULL,3}', '{\"a,b\",NULL,\"\",\"q\\\"x\"}', '{{1,2},{3,4}}', 'happy', 7, B'101')",
    "(false, 0, 0, 0, 1.5, 2.718281828459045, -0.001, '123456789012345678901234567890.123456789', '', '', '',"
    " '', '\\x', '0044-03-15 BC', '00:00:00', '00:00:00-12', '2026-11-21 10:11:12.123456',"
    " '1999-12-31 23:59:59.999999+00', '-3 days -00:00:01', '00000000-0000-0000-0000-000000000000', '[]', '{}',"
    " '::1', '::/0', 'ff:ff:ff:ff:ff:ff', -5, 0, '{}', '{}', '{}', 'sad', 1, B'')",
    "(" + ", ".join(["NULL"] * 33) + ")",
]


def same(a: object, b: object) -> bool:
    """Equality where NaN equals NaN."""
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return a == b or both_nan


@pytest.fixture
def running(pg_database: TestDatabase) -> Iterator[tuple[TestDatabase, Pipeline, MemoryDestination]]:
    db = pg_database
    db.execute("CREATE TYPE mood AS ENUM ('sad', 'happy'); CREATE DOMAIN positive AS int CHECK (VALUE > 0)")
    db.execute(f"CREATE TABLE matrix (id int PRIMARY KEY, {COLUMNS})")
    for i, values in enumerate(VALUES):
        db.execute(f"INSERT INTO matrix VALUES ({i}, {values[1:]}")
    db.execute("CREATE PUBLICATION pub FOR TABLE matrix")
    destination = MemoryDestination()
    pipeline = Pipeline(pipeline_config(db), MemoryStore(pipeline_id=1), destination)
    pipeline.start()
    try:
        yield db, pipeline, destination
    finally:
        pipeline.shutdown()


def test_copy_and_streaming_give_the_same_values(running: tuple[TestDatabase, Pipeline, MemoryDestination]) -> None:
    db, pipeline, destination = running
    wait_until(lambda: all_ready(pipeline, 1), "copy", pipeline)
    for i, values in enumerate(VALUES):
        db.execute(f"INSERT INTO matrix VALUES ({100 + i}, {values[1:]}")
    wait_until(lambda: len(destination.rows("public.matrix")) == 2 * len(VALUES), "streamed rows", pipeline)

    rows = {r["id"]: r for r in destination.rows("public.matrix")}
    source = db.execute("SELECT id, row_to_json(matrix)::text FROM matrix ORDER BY id")
    nulls = {r[0]: {k for k, v in json.loads(r[1]).items() if v is None} for r in source}
    for i in range(len(VALUES)):
        copied, streamed = rows[i], rows[100 + i]
        for column in copied:
            if column == "id":
                continue
            assert same(copied[column], streamed[column]), (
                f"{column}: copy {copied[column]!r} != stream {streamed[column]!r}"
            )
            assert (copied[column] is None) == (column in nulls[i]), f"{column}: NULL-ness differs from the source"

    first = rows[0]
    assert math.isnan(first["f4"])
    assert first["f8"] == float("-inf")
    assert first["nu"] == "NaN" and rows[1]["nu"] == "123456789012345678901234567890.123456789"
    assert first["t"] == 'héllo, "w"\n'
    assert first["by"] == b"\x00\xff\x10" and rows[1]["by"] == b""
    assert first["ai"] == [1, None, 3] and first["at"] == ["a,b", None, "", 'q"x']
    assert first["a2"] == [[1, 2], [3, 4]]
    assert first["e"] == "happy" and first["dm"] == "7"  # enums and domains keep their text form
    assert first["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert first["jb"] == '{"b": {"c": null}}'
