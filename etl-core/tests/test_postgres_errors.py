"""``etl.postgres.errors.passes``: the one reading of a server error's SQLSTATE that says whether it may pass, which
the copy and the replication connection both ask (their errors are tested against a real server elsewhere:
``test_copy_faults.py``, ``test_replication_connection.py``)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from etl.postgres.errors import passes


@pytest.mark.parametrize(
    ("error", "may_pass"),
    [
        (errors.AdminShutdown("terminating connection due to administrator command"), True),  # 57P01
        (errors.QueryCanceled("canceling statement due to user request"), True),  # 57014
        (errors.ConnectionFailure("connection failure"), True),  # 08006
        (errors.TooManyConnections("sorry, too many clients already"), True),  # 53300
        (errors.DiskFull("could not extend file"), True),  # 53100
        (errors.ConfigurationLimitExceeded("all replication slots are in use"), False),  # 53400
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),  # no SQLSTATE: broke
        (errors.UndefinedTable('relation "t" does not exist'), False),  # 42P01
        (errors.InsufficientPrivilege("permission denied"), False),  # 42501
        (psycopg.DatabaseError("no SQLSTATE, not a broken connection"), False),
    ],
)
def test_a_server_error_passes_by_its_sqlstate_class(error: psycopg.Error, may_pass: bool) -> None:
    assert passes(error) is may_pass
