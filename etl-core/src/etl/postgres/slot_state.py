"""A replication slot as the source shows it, read over a normal connection, and the errors of a slot that is
missing or lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from etl.errors import SourceError
from etl.lsn import Lsn


@dataclass(frozen=True)
class SlotState:
    """A slot as ``pg_replication_slots`` shows it."""

    exists: bool
    confirmed_flush_lsn: Lsn = Lsn.ZERO
    """Where a restart of the slot begins; ``Lsn.ZERO`` when the slot does not exist."""
    wal_status: str | None = None
    """``reserved``, ``extended``, ``unreserved`` or ``lost`` (``lost``: the slot was invalidated)."""
    active_pid: int | None = None
    invalidation_reason: str | None = None
    """Why the slot was invalidated (Postgres 17+ reports it; earlier ``wal_removed`` is assumed when lost)."""
    failover: bool = False
    """A failover slot, kept in step on standbys with ``sync_replication_slots`` (Postgres 17+)."""

    @property
    def invalidated(self) -> bool:
        return self.invalidation_reason is not None


def slot_state(conn: psycopg.Connection[Any], name: str) -> SlotState:
    """Look up replication slot ``name`` over a normal connection."""
    # to_jsonb(row) reads the columns each major has without a per-version query
    row = conn.execute(
        "SELECT to_jsonb(s) FROM pg_catalog.pg_replication_slots s WHERE slot_name = %s", (name,)
    ).fetchone()
    if row is None:
        return SlotState(exists=False)
    slot: dict[str, Any] = row[0]
    flushed = slot.get("confirmed_flush_lsn")
    reason = slot.get("invalidation_reason")
    if reason is None and slot.get("wal_status") == "lost":
        reason = "wal_removed"
    if reason is None and slot.get("conflicting"):
        reason = "rows_removed"
    return SlotState(
        exists=True,
        confirmed_flush_lsn=Lsn.parse(flushed) if flushed else Lsn.ZERO,
        wal_status=slot.get("wal_status"),
        active_pid=slot.get("active_pid"),
        invalidation_reason=reason,
        failover=bool(slot.get("failover")),
    )


class SlotNotFoundError(SourceError):
    """The named replication slot does not exist."""


class SlotLostError(SourceError):
    """A slot that progress was kept for is gone or invalidated: the server no longer keeps the changes since."""

    @classmethod
    def of(cls, slot: str, state: SlotState, consequence: str, recovery: str) -> SlotLostError:
        what = (
            f"was invalidated ({state.invalidation_reason})"
            if state.exists and state.invalidated
            else "is gone (dropped outside etl, or the source failed over to a standby without a synced copy of it)"
        )
        return cls(
            f"replication slot {slot} {what}: the changes since its position are no longer kept; {consequence}",
            hint=recovery,
        )
