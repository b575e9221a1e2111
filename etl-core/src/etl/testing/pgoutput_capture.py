"""Real pgoutput payloads for tests, captured through the SQL decoding functions (test-only; the engine never polls).

``capture`` runs a workload on a fresh slot of a test database and returns the payloads. ``WORKLOADS``
defines the checked-in captures that the decoder tests read without a server: the file
``<name>.pg<major>.json`` (see ``Captured``) holds what workload ``name`` gave on Postgres ``major``: the
payloads in hex, one per line, and the facts the workload recorded (xids, OIDs, LSNs) to check them
against. Refresh them all, on a throwaway cluster per major (the Postgres 15 and 18 installations of
the test suite)::

    python -m etl.testing.pgoutput_capture --refresh etl-core/tests/data/pgoutput
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import psycopg
import structlog

from etl.demo_postgres import PERSON_SESSION, find_install
from etl.log import configure_logging
from etl.postgres.connection import conninfo_string
from etl.testing.clusters import TemporaryCluster
from etl.testing.pytest_plugin import TestDatabase

log = structlog.get_logger(__name__)

_counter = itertools.count()

Conn = psycopg.Connection[Any]
Workload = Callable[[Conn], object]  # what it returns is ignored
Facts = dict[str, Any]
"""What a workload recorded while it ran, as JSON values (LSNs as text, times in ISO format)."""

CAPTURED_MAJORS: Final = (15, 18)
"""The Postgres majors of the checked-in captures (those of the test suite)."""


def capture(
    database: TestDatabase, workload: Workload, *, proto_version: int = 1, streaming: bool = False, setup: str = ""
) -> list[bytes]:
    """Run ``workload`` on a fresh slot of ``database`` (the ``pg_database`` fixture) and return the payloads.

    ``setup`` runs before the slot exists (DDL, publication ``p`` must be created there or here by default).
    The session has the engine's pinned text forms (``SESSION_SETTINGS``: UTC, ISO dates...), so values are
    in the text form the engine receives. With ``streaming``, large transactions are streamed:
    ``logical_decoding_work_mem`` is 64kB, and on Postgres 16+ every change is streamed at once so that
    already-aborted transactions still stream (newer servers skip streaming a transaction they know has aborted).
    """
    slot = f"capture_{next(_counter)}"
    conninfo = conninfo_string(database.connection(), PERSON_SESSION, options="-c synchronous_commit=on")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if setup:
            conn.execute(setup)
        if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = 'p'").fetchone():
            conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            workload(conn)
            # Abort records are not flushed and decoding stops at the flushed WAL: a synchronous
            # commit that writes WAL (a temp table is never published) flushes everything before it.
            conn.execute(f"CREATE TEMP TABLE wal_flush_{slot} ()")
            options = ["proto_version", str(proto_version), "publication_names", "p", "messages", "true"]
            if streaming:
                options += ["streaming", "on"]
                conn.execute("SET logical_decoding_work_mem = '64kB'")
                if database.major >= 16:
                    conn.execute("SET debug_logical_replication_streaming = immediate")
            rows = conn.execute(
                "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, VARIADIC %s::text[])",
                (slot, options),
            ).fetchall()
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return [bytes(row[0]) for row in rows]


# -- the checked-in captures ------------------------------------------------------------------------


@dataclass(frozen=True)
class PgOutputWorkload:
    """What one checked-in capture holds: tables made by ``setup``, then the changes ``run`` makes."""

    name: str
    description: str
    setup: str
    run: Callable[[Conn], Facts]
    proto_version: int = 1
    streaming: bool = False


@dataclass(frozen=True)
class Captured:
    """The payloads a workload gave on one server, and the facts it recorded."""

    workload: str
    major: int
    server_version: str
    proto_version: int
    streaming: bool
    facts: Facts
    payloads: list[bytes]

    def to_json(self) -> str:
        """The file's text: a JSON object of a key per line, with a line per fact and per payload (in hex)."""
        description = WORKLOADS[self.workload].description if self.workload in WORKLOADS else ""
        head = {
            "workload": self.workload,
            "description": description,
            "major": self.major,
            "server_version": self.server_version,
            "proto_version": self.proto_version,
            "streaming": self.streaming,
        }
        lines = ["{", *(f" {_json(key)}: {_json(value)}," for key, value in head.items()), ' "facts": {']
        lines += [f"  {_json(key)}: {_json(value)}," for key, value in self.facts.items()]
        lines[-1] = lines[-1].removesuffix(",")
        lines += [" },", ' "payloads": [', *(f'  "{payload.hex()}",' for payload in self.payloads)]
        lines[-1] = lines[-1].removesuffix(",")
        return "\n".join([*lines, " ]", "}", ""])

    @classmethod
    def from_json(cls, text: str) -> Captured:
        document = json.loads(text)
        return cls(
            document["workload"],
            document["major"],
            document["server_version"],
            document["proto_version"],
            document["streaming"],
            document["facts"],
            [bytes.fromhex(payload) for payload in document["payloads"]],
        )


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def capture_path(directory: Path, workload: str, major: int) -> Path:
    return directory / f"{workload}.pg{major}.json"


def load_capture(directory: Path, workload: str, major: int) -> Captured:
    """The checked-in capture of ``workload`` on Postgres ``major``."""
    return Captured.from_json(capture_path(directory, workload, major).read_text(encoding="utf-8"))


def capture_workload(database: TestDatabase, workload: PgOutputWorkload) -> Captured:
    """Capture ``workload`` on ``database`` now (a database of its own: its setup creates tables)."""
    facts: Facts = {}
    payloads = capture(
        database,
        lambda conn: facts.update(workload.run(conn)),
        proto_version=workload.proto_version,
        streaming=workload.streaming,
        setup=workload.setup,
    )
    (version,) = database.execute("SHOW server_version")[0]
    return Captured(workload.name, database.major, version, workload.proto_version, workload.streaming, facts, payloads)


def _scalar(conn: Conn, sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def _oid(conn: Conn, regclass: str) -> int:
    return int(_scalar(conn, "SELECT %s::regclass::oid", (regclass,)))


def _now(conn: Conn) -> str:
    return str(_scalar(conn, "SELECT clock_timestamp()").isoformat())


def _transaction(conn: Conn) -> Facts:
    before = _now(conn)
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (1, 'héllo ☃', NULL, 12.50, ''), (2, NULL, 7, NULL, 'x')")
        xid = int(_scalar(conn, "SELECT txid_current()"))
    types = conn.execute(
        "SELECT atttypid, atttypmod FROM pg_attribute WHERE attrelid = 't'::regclass AND attnum > 0 ORDER BY attnum"
    ).fetchall()
    return {
        "xid": xid,
        "committed_after": before,
        "committed_before": _now(conn),
        "wal_lsn_after": str(_scalar(conn, "SELECT pg_current_wal_lsn()::text")),
        "oid": _oid(conn, "t"),
        "column_types": [[int(type_oid), int(typmod)] for type_oid, typmod in types],
    }


def _updates(conn: Conn) -> Facts:
    big = "x" * 2500  # past the TOAST threshold (2kB): stored out of line (t.a has no compression)
    conn.execute("INSERT INTO t VALUES (1, %s, 1)", (big,))
    conn.execute("UPDATE t SET b = 2 WHERE id = 1")  # big value untouched: unchanged TOAST
    conn.execute("UPDATE t SET id = 10 WHERE id = 1")  # key change: old key sent
    conn.execute("DELETE FROM t WHERE id = 10")
    conn.execute("INSERT INTO f VALUES (1, 'a', %s)", (big,))
    conn.execute("UPDATE f SET v = 'b'")
    conn.execute("DELETE FROM f")
    return {"big_length": len(big), "t": _oid(conn, "t"), "f": _oid(conn, "f")}


def _truncate_type_message_origin(conn: Conn) -> Facts:
    conn.execute("INSERT INTO parent VALUES (1, 'happy')")
    conn.execute("INSERT INTO child VALUES (1)")
    conn.execute("TRUNCATE parent RESTART IDENTITY CASCADE")
    conn.execute("TRUNCATE other")
    with conn.transaction():
        conn.execute("INSERT INTO other VALUES (1)")
        conn.execute("SELECT pg_logical_emit_message(true, 'etl', 'in a transaction')")
    message_lsn = str(_scalar(conn, "SELECT pg_logical_emit_message(false, 'etl', '\\x00ff'::bytea)::text"))
    # Origins belong to the cluster: create it once (a transaction that publishes no change is not sent).
    conn.execute(
        "SELECT pg_replication_origin_create('upstream')"
        " WHERE NOT EXISTS (SELECT FROM pg_replication_origin WHERE roname = 'upstream')"
    )
    conn.execute("SELECT pg_replication_origin_session_setup('upstream')")
    conn.execute("INSERT INTO other VALUES (2)")
    conn.execute("SELECT pg_replication_origin_session_reset()")
    return {
        "message_lsn": message_lsn,
        "parent": _oid(conn, "parent"),
        "child": _oid(conn, "child"),
        "other": _oid(conn, "other"),
        "mood": int(_scalar(conn, "SELECT 'mood'::regtype::oid")),
    }


def _streamed(conn: Conn) -> Facts:
    rows = 20
    # Unpublished rows that make each transaction pass logical_decoding_work_mem (64kB), as Postgres 15
    # needs to stream it (16+ streams every change), without putting more payloads in the capture.
    filler = "INSERT INTO filler SELECT repeat('z', 1500) FROM generate_series(1, 60)"
    with conn.transaction():
        conn.execute("INSERT INTO s SELECT g, 'committed' FROM generate_series(1, %s) g", (rows,))
        conn.execute(filler)
        committed = int(_scalar(conn, "SELECT txid_current()"))
    with conn.transaction():
        conn.execute("INSERT INTO s SELECT g, 'kept' FROM generate_series(101, 100 + %s) g", (rows,))
        conn.execute("SELECT pg_logical_emit_message(true, 'etl', 'streamed')")
        conn.execute(filler)
        with conn.transaction(force_rollback=True):  # a subtransaction rolled back
            conn.execute("INSERT INTO s SELECT g, 'subxact' FROM generate_series(201, 200 + %s) g", (rows,))
            conn.execute(filler)
        conn.execute("INSERT INTO s VALUES (300, 'after')")
        kept = int(_scalar(conn, "SELECT txid_current()"))
    with conn.transaction(force_rollback=True):
        conn.execute("INSERT INTO s SELECT g, 'aborted' FROM generate_series(401, 400 + %s) g", (rows,))
        conn.execute(filler)
        aborted = int(_scalar(conn, "SELECT txid_current()"))
    return {"rows": rows, "committed": committed, "kept": kept, "aborted": aborted}


def _inserts(conn: Conn) -> Facts:
    rows = 50
    conn.execute(
        "INSERT INTO w SELECT g, g %% 1000, 'name ' || g, timestamptz '2024-01-02 03:04:05+00' + g * interval '1 s',"
        " g / 7.0, g %% 2 = 0, NULL, g * 1.5, date '2024-01-02' + g, md5(g::text)::uuid FROM generate_series(1, %s) g",
        (rows,),
    )
    return {"rows": rows}


WORKLOADS: Final[dict[str, PgOutputWorkload]] = {
    w.name: w
    for w in [
        PgOutputWorkload(
            "transaction",
            "Protocol 1: one transaction of two inserts into a new table: Begin, Relation, Insert, Insert, Commit.",
            "CREATE TABLE t (id int PRIMARY KEY, a text, b int, n numeric(10, 2), e varchar(5))",
            _transaction,
        ),
        PgOutputWorkload(
            "updates",
            "Protocol 1: updates and deletes of rows with a large value ('x' repeated big_length times): unchanged"
            " TOAST values, a key change, and REPLICA IDENTITY FULL.",
            "CREATE TABLE t (id int PRIMARY KEY, a text, b int);"
            "ALTER TABLE t ALTER COLUMN a SET STORAGE EXTERNAL;"
            "CREATE TABLE f (id int, v text, big text);"
            "ALTER TABLE f REPLICA IDENTITY FULL",
            _updates,
        ),
        PgOutputWorkload(
            "truncate_type_message_origin",
            "Protocol 1: truncates (cascading, restarting identity), an enum type, logical messages"
            " (transactional and not) and a change made under a replication origin.",
            "CREATE TYPE mood AS ENUM ('sad', 'happy');"
            "CREATE TABLE parent (id int GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, m mood);"
            "CREATE TABLE child (id int REFERENCES parent);"
            "CREATE TABLE other (id int)",
            _truncate_type_message_origin,
        ),
        PgOutputWorkload(
            "streamed",
            "Protocol 2 with streaming: a committed transaction, one with a message and a subtransaction"
            " rolled back, and an aborted one, each streamed (with unpublished filler rows, so each passes 64kB).",
            "CREATE TABLE s (id int, v text); CREATE TABLE filler (v text); CREATE PUBLICATION p FOR TABLE s",
            _streamed,
            proto_version=2,
            streaming=True,
        ),
        PgOutputWorkload(
            "inserts",
            "Protocol 1: inserts of ten columns of common types (deterministic values).",
            "CREATE TABLE w (id bigint PRIMARY KEY, a int, b text, c timestamptz, d numeric(12, 2),"
            " e boolean, f text, g double precision, h date, i uuid)",
            _inserts,
        ),
    ]
}
"""The checked-in captures by name."""


@contextlib.contextmanager
def _database(cluster: TemporaryCluster, name: str) -> Iterator[TestDatabase]:
    """A fresh database, as the ``pg_database`` fixture gives."""
    cluster.create_database(name)
    try:
        yield TestDatabase(cluster, name)
    finally:
        cluster.drop_database(name)


def refresh(directory: Path, majors: Sequence[int] = CAPTURED_MAJORS, names: Sequence[str] = ()) -> list[Path]:
    """Capture the workloads ``names`` (all by default) on a throwaway cluster of each major into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for major in majors:
        with TemporaryCluster(find_install(major)) as cluster:
            for name in names or list(WORKLOADS):
                with _database(cluster, f"capture_{name}") as database:
                    captured = capture_workload(database, WORKLOADS[name])
                path = capture_path(directory, name, major)
                path.write_text(captured.to_json(), encoding="utf-8")
                log.info("captured", path=str(path), payloads=len(captured.payloads), server=captured.server_version)
                written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m etl.testing.pgoutput_capture", description=__doc__)
    parser.add_argument("--refresh", type=Path, required=True, metavar="DIR", help="directory of the captures")
    parser.add_argument("--major", type=int, action="append", help="Postgres major (repeatable; default 15 and 18)")
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS), help="only these (repeatable)")
    args = parser.parse_args(argv)
    configure_logging()
    refresh(args.refresh, args.major or CAPTURED_MAJORS, args.workload or ())


if __name__ == "__main__":
    main()
