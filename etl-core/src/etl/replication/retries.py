"""Errored tables: which failures may pass by themselves, and when such a table is copied again.

A failure that may pass (the destination or the network failed for this table) makes the table
Errored with a timed retry: after ``table_error_retry_delay_ms``, doubled at each further attempt,
the apply worker copies the table again. After ``table_error_retry_max_attempts`` such attempts, or at
once for a failure that needs the user (a value the destination cannot hold, a type change, a
refused permission), the table waits for ``etl resync``. A type change the destination cannot apply is copied
again at once instead, when ``[copy] on_type_change = "resync"`` says so.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from etl.config import PipelineSection
from etl.errors import EtlError, TypeChangeError, may_pass
from etl.schema import TableId
from etl.store.base import RetryKind, TableState, TableStateKind


def describe(error: BaseException) -> tuple[str, str | None]:
    """The reason and hint to record for a table that failed with ``error``."""
    if isinstance(error, EtlError):
        return error.message, error.hint
    return f"{type(error).__name__}: {error}", "see the log for the traceback"


class TableRetries:
    """The Errored state for a failed table, counting each table's timed retries (in this process)."""

    def __init__(self, config: PipelineSection, *, resync_on_type_change: bool = False) -> None:
        self._delay = timedelta(milliseconds=config.table_error_retry_delay_ms)
        self._max_attempts = config.table_error_retry_max_attempts
        self._resync_on_type_change = resync_on_type_change
        self._attempts: dict[TableId, int] = {}
        self._lock = threading.Lock()

    def errored(self, table_id: TableId, error: BaseException, resync_command: str) -> TableState:
        reason, hint = describe(error)
        if isinstance(error, TypeChangeError) and self._resync_on_type_change:
            # due at once and not counted: not a failure that may pass, but a copy the user asked for in advance
            hint = 'copied again with the new type ([copy] on_type_change = "resync")'
            return TableState.errored(reason, hint, RetryKind.TIMED, datetime.now(UTC))
        if not may_pass(error):
            return TableState.errored(reason, hint or f"fix the cause, then `{resync_command}`", RetryKind.MANUAL)
        with self._lock:
            attempt = self._attempts.get(table_id, 0) + 1
            if attempt > self._max_attempts:
                return TableState.errored(
                    reason,
                    f"gave up after {self._max_attempts} timed retries; fix the cause, then `{resync_command}`",
                    RetryKind.MANUAL,
                )
            self._attempts[table_id] = attempt
        retry_at = datetime.now(UTC) + self._delay * 2 ** (attempt - 1)
        return TableState.errored(reason, hint, RetryKind.TIMED, retry_at)

    def forget(self, table_id: TableId) -> None:
        """Start counting again (the user asked for the table to be copied again)."""
        with self._lock:
            self._attempts.pop(table_id, None)


def due(states: Mapping[TableId, TableState], now: datetime) -> list[TableId]:
    """The Errored tables whose timed retry is due."""
    return sorted(
        table_id
        for table_id, state in states.items()
        if state.kind is TableStateKind.ERRORED
        and state.retry is RetryKind.TIMED
        and (state.retry_at is None or state.retry_at <= now)
    )
