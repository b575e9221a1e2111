"""Whether the standbys a primary waits for hold a WAL position: a copy writes nothing a failover may take back.

A primary that lists physical slots in ``synchronized_standby_slots`` (Postgres 17+) holds its logical walsenders
back until those standbys have flushed what they send, so after a failover to one of them the stream goes on with
nothing the new primary lacks. A copy reads tables, not the stream: a row it reads may sit in WAL that no standby
has yet. Written to the destination and then lost in a failover, such a row (or a lost update's value) would stay
there, and no change would ever come to remove it. So a copy writes what it read only once every standby slot has
flushed past the WAL position of its read: the rule Postgres applies to the stream, applied to copies.

A standby slot's ``restart_lsn`` is what its standby has flushed. A listed slot that is missing, logical or
invalidated never catches up; Postgres's walsenders wait on it as well, so a copy waits too, and says why.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import psycopg
import structlog

from etl.config import PostgresConnection
from etl.lsn import Lsn
from etl.postgres.connection import connect, connection_error

log = structlog.get_logger(__name__)

SETTING: Final = (
    "CASE WHEN pg_catalog.pg_is_in_recovery() THEN ''"
    " ELSE coalesce(pg_catalog.current_setting('synchronized_standby_slots', true), '') END"
)
"""SQL of the standby slots a copy waits for (``parse_setting``): none on a standby, or before Postgres 17."""

_SLOTS: Final = (
    "SELECT slot_name::pg_catalog.text, slot_type, restart_lsn::pg_catalog.text, wal_status"
    " FROM pg_catalog.pg_replication_slots"
    " WHERE slot_name::pg_catalog.text OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.text[])"
)
_FLUSHED: Final = (
    "SELECT pg_catalog.pg_current_wal_flush_lsn()::pg_catalog.text, setting FROM pg_catalog.pg_settings"
    " WHERE name OPERATOR(pg_catalog.=) 'wal_writer_delay'"
)
POLL_S: Final = 0.05
"""Seconds between looks at the standby slots while a copy waits for them (standbys report each flush)."""


def parse_setting(value: str) -> tuple[str, ...]:
    """The slot names of a ``synchronized_standby_slots`` value (a list of names, each possibly double-quoted)."""
    names = (part.strip() for part in value.split(","))
    return tuple(name[1:-1] if len(name) > 1 and name[0] == name[-1] == '"' else name for name in names if name)


@dataclass(frozen=True)
class SlotRow:
    """One row of ``pg_replication_slots`` for a standby slot."""

    name: str
    slot_type: str
    restart_lsn: Lsn | None
    wal_status: str | None


def behind(slots: Sequence[str], rows: Sequence[SlotRow], lsn: Lsn) -> list[str]:
    """Why the standbys of ``slots`` may lack ``lsn``: one line per slot that has not flushed past it (empty when
    they all have). Sans-IO."""
    found = {row.name: row for row in rows}
    reasons = []
    for name in slots:
        row = found.get(name)
        if row is None:
            reasons.append(f"{name}: no such replication slot")
        elif row.slot_type != "physical":
            reasons.append(f"{name}: a {row.slot_type} slot, not a standby's physical one")
        elif row.wal_status == "lost" or row.restart_lsn is None:
            reasons.append(f"{name}: invalidated, or never used by a standby")
        elif row.restart_lsn < lsn:
            reasons.append(f"{name}: its standby has flushed up to {row.restart_lsn}, not yet {lsn}")
    return reasons


def wait_for_standbys(
    config: PostgresConnection,
    slots: Sequence[str],
    lsn: Lsn,
    *,
    what: str,
    stop: threading.Event,
    timeout: float | None = None,
    warn_after: float = 5.0,
) -> list[str]:
    """Wait until every standby slot of ``slots`` has what a read that ended at ``lsn`` saw (at once when there are
    none): ``[]``; or ``behind``'s reasons when ``timeout`` passes first, or ``stop`` is set. ``what`` names the
    waiting copy in the warning logged once the wait lasts ``warn_after`` seconds.

    ``lsn`` is where WAL insertion stood at the read, and a standby receives only flushed WAL. Every commit the read
    saw is flushed by then, or (an asynchronous commit) within ``wal_writer_delay``; records after the last commit
    may wait for a later one. So once the primary has flushed up to ``lsn``, or three ``wal_writer_delay`` have
    passed, the standbys need only what the primary has flushed."""
    if not slots:
        return []
    started = time.monotonic()
    warned = False
    with connect(config, retried=True) as conn:
        while True:
            try:
                flushed, delay_ms, rows = _look(conn, slots)
            except psycopg.OperationalError as exc:
                raise connection_error(config, exc, "read the standby slots of", retried=True) from None
            waited = time.monotonic() - started
            target = lsn if flushed >= lsn or waited < 3 * delay_ms / 1000 else flushed
            reasons = behind(slots, rows, target)
            if not reasons or stop.is_set() or (timeout is not None and waited >= timeout):
                return reasons
            if not warned and waited >= warn_after:
                log.warning(
                    "a copy waits until the standbys in synchronized_standby_slots have what it read",
                    copy=what,
                    position=str(target),
                    standbys=reasons,
                    hint="a standby that lags or is gone holds the copy back, as it holds the stream back:"
                    " bring it back, or take its slot out of synchronized_standby_slots",
                )
                warned = True
            stop.wait(POLL_S)


def _look(conn: psycopg.Connection[Any], slots: Sequence[str]) -> tuple[Lsn, int, list[SlotRow]]:
    """The primary's flushed WAL position, its ``wal_writer_delay`` in milliseconds, and the standby slots' rows."""
    row = conn.execute(_FLUSHED).fetchone()
    assert row is not None
    rows = [
        SlotRow(name, kind, None if restart is None else Lsn.parse(restart), status)
        for name, kind, restart, status in conn.execute(_SLOTS, (list(slots),)).fetchall()
    ]
    return Lsn.parse(row[0]), int(row[1]), rows
