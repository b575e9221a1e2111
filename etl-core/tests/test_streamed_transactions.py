"""StreamedTransactions: buffering, spilling and aborting protocol-2 in-progress transactions."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest

from etl.errors import EtlError
from etl.events import DeleteEvent, InsertEvent, UpdateEvent
from etl.lsn import Lsn
from etl.postgres import pgoutput as pg
from etl.replication.changes import ChangeBuilder
from etl.replication.spill_dir import LOCK, PREFIX, SpillDirectory, spill_base
from etl.replication.streamed import StreamedTransactions
from etl.schema import ColumnSchema, TableName, TableSchema
from etl.testing.pgoutput_capture import capture
from etl.testing.pytest_plugin import TestDatabase


def payload(n: int, size: int = 100) -> bytes:
    return n.to_bytes(4, "big") * (size // 4)


def spill_files(base: Path) -> list[Path]:
    """The spill files in the spill directories under ``base``."""
    return sorted(p for directory in base.glob(f"{PREFIX}*") for p in directory.iterdir() if p.name != LOCK)


def test_spills_past_the_threshold_and_keeps_order(tmp_path: Path) -> None:
    buffers = StreamedTransactions(SpillDirectory(tmp_path), spill_threshold_bytes=1000)
    for n in range(9):  # 900 bytes: under the threshold, all in memory
        buffers.append(1, 1, payload(n))
    assert buffers.memory_bytes == 900 and spill_files(tmp_path) == []
    peak = 0
    for n in range(9, 50):
        buffers.append(1, 1, payload(n))
        peak = max(peak, buffers.memory_bytes)
    assert peak <= 1000
    (spilled,) = spill_files(tmp_path)
    assert spilled.stat().st_size > 1000
    assert 0 < buffers.memory_bytes <= 1000  # the latest payloads are in memory, the rest in the file
    assert list(buffers.commit(1)) == [payload(n) for n in range(50)]
    assert spill_files(tmp_path) == [] and buffers.memory_bytes == 0 and len(buffers) == 0


def test_spill_files_replay_across_read_blocks(tmp_path: Path) -> None:
    """Spill files are read back in blocks of 1 MiB: frames that straddle blocks or exceed one come back whole."""
    buffers = StreamedTransactions(SpillDirectory(tmp_path), spill_threshold_bytes=64 * 1024)
    sizes = [1 + (n * 7919) % 40_000 for n in range(200)]
    sizes[77] = 3 * 1024 * 1024  # one payload larger than a read block
    expected = [n.to_bytes(4, "big") + bytes([n % 251]) * size for n, size in enumerate(sizes)]
    for data in expected:
        buffers.append(1, 1, data)
    (spilled,) = spill_files(tmp_path)
    assert spilled.stat().st_size > 4 * 1024 * 1024
    assert list(buffers.commit(1)) == expected


def test_a_truncated_spill_file_is_an_error(tmp_path: Path) -> None:
    buffers = StreamedTransactions(SpillDirectory(tmp_path), spill_threshold_bytes=1000)
    for n in range(30):
        buffers.append(1, 1, payload(n))
    (spilled,) = spill_files(tmp_path)
    with spilled.open("r+b") as file:
        file.truncate(spilled.stat().st_size - 10)
    replay = buffers.commit(1)
    with pytest.raises(EtlError, match="truncated"):
        list(replay)


def test_the_largest_transaction_spills_first(tmp_path: Path) -> None:
    buffers = StreamedTransactions(SpillDirectory(tmp_path), spill_threshold_bytes=1000)
    for n in range(3):
        buffers.append(7, 7, payload(n))  # 300 bytes
    for n in range(8):
        buffers.append(8, 8, payload(100 + n))  # 800 bytes: crosses the threshold
    assert [p.name for p in spill_files(tmp_path)] == ["xid-8.pgoutput"]
    assert buffers.memory_bytes == 300 and len(buffers) == 2
    assert list(buffers.commit(7)) == [payload(n) for n in range(3)]
    assert list(buffers.commit(8)) == [payload(100 + n) for n in range(8)]
    assert spill_files(tmp_path) == []


def test_subtransaction_abort_in_memory(tmp_path: Path) -> None:
    buffers = StreamedTransactions(SpillDirectory(tmp_path), spill_threshold_bytes=10_000)
    buffers.append(1, 1, payload(0))
    buffers.append(1, 2, payload(1))  # subtransaction 2
    buffers.append(1, 3, payload(2))  # 3, nested in 2
    buffers.append(1, 3, payload(3))
    buffers.abort(1, 3)  # ROLLBACK TO the savepoint of 3
    assert buffers.memory_bytes == 200
    buffers.append(1, 2, payload(4))  # 2 goes on
    buffers.append(1, 4, payload(5))
    buffers.abort(1, 99)  # a subtransaction without changes: nothing to drop
    assert list(buffers.commit(1)) == [payload(0), payload(1), payload(4), payload(5)]


def test_subtransaction_abort_cuts_the_spill_file(tmp_path: Path) -> None:
    buffers = StreamedTransactions(SpillDirectory(tmp_path), spill_threshold_bytes=250)
    buffers.append(1, 1, payload(0))
    buffers.append(1, 1, payload(1))
    buffers.append(1, 2, payload(2))  # subtransaction 2 starts; 300 bytes: everything spills
    (spilled,) = spill_files(tmp_path)
    buffers.append(1, 3, payload(3))  # 3 (nested in 2) starts in memory
    buffers.append(1, 2, payload(4))
    assert spilled.stat().st_size == 3 * 104 and buffers.memory_bytes == 200
    buffers.abort(1, 2)  # drops 2, 3, 4: the file is cut back to where 2 began, memory emptied
    assert spilled.stat().st_size == 2 * 104 and buffers.memory_bytes == 0
    buffers.abort(1, 3)  # ended with its parent: nothing left to drop
    buffers.append(1, 1, payload(5))
    buffers.append(1, 5, payload(6))
    assert list(buffers.commit(1)) == [payload(0), payload(1), payload(5), payload(6)]
    assert spill_files(tmp_path) == []


def test_whole_abort_and_close_remove_files(tmp_path: Path) -> None:
    buffers = StreamedTransactions(SpillDirectory(tmp_path), spill_threshold_bytes=100)
    for n in range(5):
        buffers.append(1, 1, payload(n))
        buffers.append(2, 2, payload(n))
    assert len(spill_files(tmp_path)) == 2
    buffers.abort(1, 1)
    assert [p.name for p in spill_files(tmp_path)] == ["xid-2.pgoutput"] and len(buffers) == 1
    assert list(buffers.commit(1)) == []  # unknown (aborted) transaction: nothing
    buffers.close()
    assert spill_files(tmp_path) == [] and len(buffers) == 0 and buffers.memory_bytes == 0
    buffers.close()


def test_the_default_spill_directory_is_under_the_system_temporary_directory_and_removed() -> None:
    spill = SpillDirectory(spill_base(None))
    buffers = StreamedTransactions(spill, spill_threshold_bytes=0)
    buffers.append(1, 1, payload(0))
    directory = spill.path
    assert directory.parent == Path(tempfile.gettempdir()) and directory.name.startswith(PREFIX)
    assert (directory / "xid-1.pgoutput").exists()
    buffers.close()
    assert not directory.exists()


def test_spill_errors_say_what_to_check(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    buffers = StreamedTransactions(SpillDirectory(missing), spill_threshold_bytes=0)
    with pytest.raises(EtlError, match=f"could not make a spill directory in {missing}") as error:
        buffers.append(1, 1, payload(0))
    assert error.value.hint is not None and "spill_directory" in error.value.hint


def test_a_spill_directory_gone_under_the_pipeline_says_what_to_check(tmp_path: Path) -> None:
    spill = SpillDirectory(tmp_path)
    buffers = StreamedTransactions(spill, spill_threshold_bytes=0)
    shutil.rmtree(spill.path)
    with pytest.raises(EtlError, match="could not write the spill file") as error:
        buffers.append(1, 1, payload(0))
    assert error.value.hint is not None and "spill_directory" in error.value.hint


def test_streamed_transactions_from_postgres_end_to_end(pg_database: TestDatabase, tmp_path: Path) -> None:
    """Real protocol-2 payloads: buffered (spilling), replayed on commit, dropped on (sub)abort.

    What a destination receives equals what the table finally holds.
    """

    def workload(conn: psycopg.Connection[Any]) -> None:
        conn.execute("INSERT INTO s SELECT g, repeat('c', 50) FROM generate_series(1, 2000) g")
        with conn.transaction():
            conn.execute("INSERT INTO s SELECT g, 'kept' FROM generate_series(10001, 12000) g")
            with pytest.raises(RuntimeError), conn.transaction():
                conn.execute("INSERT INTO s SELECT g, 'subxact' FROM generate_series(20001, 22000) g")
                conn.execute("UPDATE s SET v = 'changed in subxact' WHERE id <= 10")
                raise RuntimeError("roll back to the savepoint")
            conn.execute("UPDATE s SET v = 'changed' WHERE id BETWEEN 11 AND 20")
            conn.execute("DELETE FROM s WHERE id BETWEEN 21 AND 30")
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO s SELECT g, 'aborted' FROM generate_series(40001, 42000) g")
            raise RuntimeError("roll back")
        conn.execute("INSERT INTO s VALUES (50000, 'small')")

    setup = "CREATE TABLE s (id int PRIMARY KEY, v text)"
    payloads = capture(pg_database, workload, proto_version=2, streaming=True, setup=setup)
    final = dict(pg_database.execute("SELECT id, v FROM s"))

    decoder = pg.PgOutputDecoder(2)
    threshold = 64 * 1024
    buffers = StreamedTransactions(SpillDirectory(tmp_path), spill_threshold_bytes=threshold)
    schemas: dict[int, TableSchema] = {}
    builder = ChangeBuilder(schemas.__getitem__)
    stream_xid: int | None = None
    most_files = peak_memory = 0

    def apply(message: pg.Message, lsn: Lsn) -> None:
        if isinstance(message, pg.Relation):
            columns = tuple(
                ColumnSchema(c.name, c.type_oid, c.type_modifier, primary_key=c.flags_key) for c in message.columns
            )
            schemas[message.oid] = TableSchema(message.oid, TableName(message.namespace, message.name), columns)
        elif isinstance(message, pg.Insert):
            builder.insert(message.relation_oid, message.new, lsn)
        elif isinstance(message, pg.Update):
            builder.update(message.relation_oid, message.old_kind, message.old, message.new, lsn)
        elif isinstance(message, pg.Delete):
            builder.delete(message.relation_oid, message.old_kind, message.old, lsn)

    final_lsn = Lsn.ZERO
    for raw in payloads:
        if stream_xid is not None and raw[:1] in pg.STREAMABLE:
            buffers.append(stream_xid, pg.stream_xid(raw), raw)
            most_files = max(most_files, len(spill_files(tmp_path)))
            peak_memory = max(peak_memory, buffers.memory_bytes)
            continue
        message = decoder.decode(raw)
        if isinstance(message, pg.StreamStart):
            stream_xid = message.xid
        elif isinstance(message, pg.StreamStop):
            stream_xid = None
        elif isinstance(message, pg.StreamCommit):
            builder.begin(message.xid, message.commit_lsn, message.commit_ts, message.commit_lsn)
            for change in buffers.commit(message.xid):
                apply(decoder.decode_streamed(change), message.commit_lsn)
            builder.commit(message.commit_lsn, message.end_lsn, message.commit_ts, message.commit_lsn)
        elif isinstance(message, pg.StreamAbort):
            buffers.abort(message.xid, message.subxid)
        elif isinstance(message, pg.Begin):
            final_lsn = message.final_lsn
            builder.begin(message.xid, message.final_lsn, message.commit_ts, message.final_lsn)
        elif isinstance(message, pg.Commit):
            builder.commit(message.commit_lsn, message.end_lsn, message.commit_ts, message.commit_lsn)
        else:
            apply(message, final_lsn)

    assert most_files >= 1, "the large transactions spilled to disk"
    assert peak_memory <= threshold
    assert len(buffers) == 0 and spill_files(tmp_path) == []
    rows: dict[int, str] = {}
    for event in builder.build().events():
        if isinstance(event, InsertEvent):
            rows[event.row[0]] = event.row[1]
        elif isinstance(event, UpdateEvent):
            rows.pop(event.old_row[0] if event.old_row is not None else event.row[0])
            rows[event.row[0]] = event.row[1]
        elif isinstance(event, DeleteEvent):
            rows.pop(event.old_row[0])
    assert rows == final
    assert not {"subxact", "aborted", "changed in subxact"} & set(rows.values())
