"""What the key lookup reads (data files' key columns, delete files' positions) is read once and kept
(``key_cache.LookupCache``), within a bound of bytes; files a batch wrote on the driver are not read back.
The batches that use them end equal to the memory destination, DuckDB reading the lake."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from etl.destination.base import DestinationContext
from etl.destination.memory import MemoryDestination
from etl.schema import ColumnSchema, TableName, TableSchema
from etl.store.base import TableState, TableStateKind
from etl.store.memory import MemoryStore
from etl.testing.pipelines import wait_until
from etl_spark.ducklake.catalog import DataFile, LakeColumn
from etl_spark.ducklake.destination import DuckLakeDestination
from etl_spark.ducklake.key_cache import LookupCache
from etl_spark.ducklake.plan import TablePlan
from etl_spark.ducklake.storage import LakeStorage
from etl_spark.ducklake.types import FIELD_ID

ACCOUNTS = TableSchema(
    16950,
    TableName("public", "accounts"),
    (ColumnSchema("id", 20, nullable=False, primary_key=True, attnum=1), ColumnSchema("note", 25, attnum=2)),
)


def column(values: list[int]) -> pa.ChunkedArray:
    return pa.chunked_array([pa.array(values, pa.int64())])


def test_a_cached_column_is_not_read_again() -> None:
    cache, reads = LookupCache(1 << 20), Counter[str]()

    def read(path: str) -> Any:
        reads[path] += 1
        return column([1, 2, 3]) if path != "old.parquet" else None  # a file from before the column existed

    for _ in range(3):
        assert cache.get(("a.parquet", 1), lambda: read("a.parquet")) == column([1, 2, 3])
        assert cache.get(("old.parquet", 1), lambda: read("old.parquet")) is None
    assert reads == {"a.parquet": 1, "old.parquet": 1}
    assert cache.get(("a.parquet", 2), lambda: read("a.parquet")) is not None  # another column: another entry
    assert reads["a.parquet"] == 2


def test_the_least_recently_used_columns_go_first_past_the_bound() -> None:
    one = column(list(range(1000)))  # 8,000 bytes
    cache = LookupCache(20_000)
    cache.get(("a", 1), lambda: one)
    cache.get(("b", 1), lambda: one)
    cache.get(("a", 1), lambda: pytest.fail("a was cached"))  # a is now the most recently used
    cache.get(("c", 1), lambda: one)  # 3 x 8,000 bytes: b goes
    assert cache.nbytes <= 20_000
    cache.get(("a", 1), lambda: pytest.fail("a was cached"))
    cache.get(("c", 1), lambda: pytest.fail("c was cached"))
    read_again: list[str] = []
    cache.get(("b", 1), lambda: read_again.append("b") or one)
    assert read_again == ["b"]


def test_no_bytes_keep_nothing() -> None:
    cache, reads = LookupCache(0), Counter[str]()
    for _ in range(2):
        cache.get(("a", 1), lambda: reads.update(["a"]) or column([1]))
    assert reads == {"a": 2} and cache.nbytes == 0


def test_a_path_registered_again_is_read_again(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file removed, rewritten and registered under its old path (``ducklake_add_data_files``) has a new id."""
    storage = LakeStorage(f"{tmp_path}/", key_cache_bytes=1 << 20)
    contents = {"first": column([1, 2, 3]), "second": column([3, 4])}
    on_disk = ["first"]
    monkeypatch.setattr(LakeStorage, "_column", lambda self, path, key: contents[on_disk[0]])
    key = LakeColumn(1, "id", "int64", False)

    def positions(data_file_id: int) -> list[int]:
        file = DataFile(data_file_id, "t/f.parquet", 3, None, 100, 1, 0)
        return storage.positions_of_keys(key, [file], pa.array([3], pa.int64())).column("_etl_pos").to_pylist()

    assert positions(7) == [2]
    on_disk[0] = "second"
    assert positions(7) == [2]  # the same registration: its column is the one read before
    assert positions(8) == [0]  # registered again: read again


@pytest.mark.parametrize("cache_bytes", [1 << 20, 0], ids=["cached", "off"])
def test_batches_read_only_the_copied_file_once(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch, cache_bytes: int
) -> None:
    """Files streamed batches wrote (data and delete files) are kept as written; the copied file, written by a
    Spark task, is read once. Without the cache each batch reads its candidates again."""
    destination = kit.make_destination(lake, key_cache_bytes=cache_bytes, inline_row_limit=0)
    reference = MemoryDestination()
    copied = kit.rows_table(ACCOUNTS, [{"id": i, "note": f"n{i}"} for i in range(1, 101)])
    for target in (destination, reference):
        target.write_table_rows(ACCOUNTS, copied)
    (copied_file,) = (f.path.rsplit("/", 1)[-1] for f in destination.catalog.data_files(_table(destination)))
    columns, deletes = Counter[str](), Counter[str]()
    real_column, real_delete = LakeStorage._column, LakeStorage.read_delete

    def counted_column(storage: LakeStorage, path: str, key: Any) -> Any:
        columns[path.rsplit("/", 1)[-1]] += 1
        return real_column(storage, path, key)

    def counted_delete(storage: LakeStorage, path: str, begin_snapshot: int) -> Any:
        deletes[path.rsplit("/", 1)[-1]] += 1
        return real_delete(storage, path, begin_snapshot)

    monkeypatch.setattr(LakeStorage, "_column", counted_column)
    monkeypatch.setattr(LakeStorage, "read_delete", counted_delete)
    b = kit.BatchBuilder()
    batches = [  # each updates a copied row: the copied file is a candidate every time, with a delete file after
        b.commit().update(ACCOUNTS, {"id": 1, "note": "x"}).insert(ACCOUNTS, {"id": 500, "note": "a"}).build(),
        b.commit().update(ACCOUNTS, {"id": 2, "note": "y"}).delete(ACCOUNTS, {"id": 3}).build(),
        b.commit().update(ACCOUNTS, {"id": 1, "note": "z"}).delete(ACCOUNTS, {"id": 500}).build(),
    ]
    for batch in batches:
        for target in (destination, reference):
            target.write_events(batch)
    if cache_bytes:
        assert columns == {copied_file: 1} and not deletes
    else:
        assert columns[copied_file] == 3 and len(columns) > 1  # the streamed files too
        # the copied file's delete file: batch 2 reads it to plan and to apply; batch 3 to plan (id 1 is gone)
        assert sum(deletes.values()) == 3
    names = ", ".join(ACCOUNTS.column_names)
    stored = sorted(lake.query(f"SELECT {names} FROM lake.public.accounts"))
    assert stored == sorted((r["id"], r["note"]) for r in reference.rows(ACCOUNTS.name))


def _table(destination: Any) -> Any:
    handle = destination.catalog.handle(ACCOUNTS.id)
    assert handle is not None
    return handle.table


def test_a_failure_after_the_commit_removes_none_of_the_files_it_registered(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    destination = kit.make_destination(lake, inline_row_limit=0)
    batch = kit.BatchBuilder().commit().insert(ACCOUNTS, {"id": 1, "note": "a"}).build()

    def fails(plan: TablePlan, storage: LakeStorage) -> None:
        raise RuntimeError("after the commit")

    monkeypatch.setattr(TablePlan, "remember_files", fails)
    with pytest.raises(RuntimeError, match="after the commit"):
        destination.write_events(batch)
    assert lake.query("SELECT id, note FROM lake.public.accounts") == [(1, "a")]  # its data file is still there


def test_a_start_reads_the_key_lookups_of_copied_tables_ahead(
    lake: Any, kit: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart the cache is empty: the destination reads the key column and the delete file of each copied
    table's files on a thread of its own while streaming begins, so the first batch reads none of them itself."""
    first = kit.make_destination(lake, inline_row_limit=0)
    first.write_table_rows(ACCOUNTS, kit.rows_table(ACCOUNTS, [{"id": i, "note": f"n{i}"} for i in range(1, 101)]))
    b = kit.BatchBuilder()
    first.write_events(b.commit().update(ACCOUNTS, {"id": 1, "note": "x"}).build())  # a delete file too
    first.shutdown()

    store = MemoryStore(1)
    store.store_table_schema(ACCOUNTS)
    store.update_table_states({ACCOUNTS.id: TableState(TableStateKind.READY)})
    again = DuckLakeDestination.from_config(first.config, DestinationContext(1, store))
    again.startup()
    try:
        files = again.catalog.data_files(_table(again))
        wanted = len(files) + sum(f.delete is not None for f in files)
        wait_until(lambda: len(again.storage.lookups) >= wanted, "the lookups read ahead", timeout=60)
        reads = Counter[str]()
        real_column, real_delete = LakeStorage._column, LakeStorage.read_delete

        def counted_column(storage: LakeStorage, path: str, key: Any) -> Any:
            reads["column"] += 1
            return real_column(storage, path, key)

        def counted_delete(storage: LakeStorage, path: str, begin_snapshot: int) -> Any:
            reads["delete"] += 1
            return real_delete(storage, path, begin_snapshot)

        monkeypatch.setattr(LakeStorage, "_column", counted_column)
        monkeypatch.setattr(LakeStorage, "read_delete", counted_delete)
        again.write_events(b.commit().update(ACCOUNTS, {"id": 2, "note": "y"}).update(ACCOUNTS, {"id": 1}).build())
        assert not reads, f"the first batch after the start read {dict(reads)}"
        assert sorted(lake.query("SELECT id, note FROM lake.public.accounts WHERE id <= 2")) == [(1, None), (2, "y")]
    finally:
        again.shutdown()


def test_values_at_reads_the_rows_of_several_row_groups_and_what_duckdb_reads_of_an_absent_column(
    tmp_path: Any,
) -> None:
    """A file's values at positions spread over its row groups, by field id, in position order; a column the file
    does not hold (added after it was written) reads as its initial default, or NULL without one."""
    body = pa.field("body", pa.string(), metadata={FIELD_ID: b"2"})
    rows = pa.table(
        [pa.array(range(10), pa.int64()), pa.array([f"b{i}" for i in range(10)])],
        schema=pa.schema([pa.field("id", pa.int64(), metadata={FIELD_ID: b"1"}), body]),
    )
    (tmp_path / "t").mkdir()
    pq.write_table(rows, tmp_path / "t" / "f.parquet", row_group_size=3)  # row groups of 3, 3, 3 and 1 rows
    storage = LakeStorage(f"{tmp_path}/")
    columns = [
        LakeColumn(2, "body", "varchar", True),
        LakeColumn(3, "added", "varchar", True, initial_default="x"),
        LakeColumn(4, "later", "int32", True),
    ]
    values = storage.values_at(f"{tmp_path}/t/f.parquet", np.array([0, 4, 5, 9]), columns)
    assert [v.to_pylist() for v in values] == [["b0", "b4", "b5", "b9"], ["x"] * 4, [None] * 4]
