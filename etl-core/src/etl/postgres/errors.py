"""What a Postgres server's error means for a retry: its SQLSTATE, read in one place.

Classes ``08`` (connection exception) and ``57`` (operator intervention: a shutdown, a cancelled query, a
terminated backend) mean the session is gone; class ``53`` (insufficient resources: disk full, out of memory,
too many connections) means the server refuses for now, except ``53400`` (a configured limit, such as
``max_replication_slots``, which stays until the user raises it). psycopg raises an ``OperationalError`` with no
SQLSTATE when the connection broke before the server could say anything.
"""

from __future__ import annotations

from typing import Final

import psycopg

CONFIGURATION_LIMIT_EXCEEDED: Final = "53400"
_PASSING_CLASSES: Final = ("08", "57", "53")


def passes(error: psycopg.Error) -> bool:
    """Whether the server's ``error`` may pass: a new session, or the same statement later, may succeed."""
    sqlstate = error.sqlstate or ""
    if not sqlstate:
        return isinstance(error, psycopg.OperationalError)
    return sqlstate.startswith(_PASSING_CLASSES) and sqlstate != CONFIGURATION_LIMIT_EXCEEDED
