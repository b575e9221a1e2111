"""Timestamps of the Postgres protocols: microseconds since 2000-01-01 UTC, in pgoutput messages and in the
replication protocol's keepalives and status updates."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Final

PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)
_UNIX_TO_PG_US: Final = 946_684_800_000_000


def pg_timestamp(microseconds: int) -> datetime:
    """A protocol timestamp as an aware datetime."""
    return PG_EPOCH + timedelta(microseconds=microseconds)


def now_pg_us() -> int:
    """The current time as a protocol timestamp."""
    return time.time_ns() // 1000 - _UNIX_TO_PG_US
