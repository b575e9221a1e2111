"""The progress of a copy that a destination runs itself (``TableCopier``), read from the source.

Such a copy runs where the destination's data work runs (Spark executors, say), and the destination
tells the rows it copied only when it returns. Its ``COPY`` commands show, while they run, in
``pg_stat_progress_copy`` (Postgres 14 and later) with the rows sent so far, and the plan's
connections carry an ``application_name`` of their own (``copy_application_name``), so a watcher on
the engine's side can find them (those of the pipeline's own role, in its database). Every
``interval`` seconds it adds up, over every ``COPY`` it has seen (a backend and the start of its
command: one range of the plan), the most rows that ``COPY`` reported, and hands the growth to the
copy's tracker.

The figure is an estimate until the destination returns the exact count: a ``COPY`` that starts and
ends between two looks shows only then, and the rows of a failed task attempt count while it runs.
Nothing but this figure depends on it: a look that fails is skipped, a lost connection made again, and
once the watch is closed no look hands anything on (the copy's exact count has replaced the estimate).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Final

import psycopg
import structlog

from etl.config import PostgresConnection
from etl.errors import EtlError
from etl.postgres.connection import connect

log = structlog.get_logger(__name__)

WATCH_INTERVAL_S: Final = 1.0
"""Seconds between two looks at the source's running ``COPY`` commands."""

JOIN_TIMEOUT_S: Final = 5.0
"""How long the end of a copy waits for the watcher's last look (a look on a frozen source may wait until it
thaws; it hands nothing on by then)."""

PROGRESS_VIEW_SINCE: Final = 140000
"""The server version (``server_version_num``) that has ``pg_stat_progress_copy``."""

_RUNNING_COPIES: Final = """
    SELECT a.pid, a.backend_start, a.query_start, coalesce(p.tuples_processed, 0)
    FROM pg_catalog.pg_stat_progress_copy p JOIN pg_catalog.pg_stat_activity a ON a.pid = p.pid
    WHERE a.application_name = %s AND a.usename = current_user AND a.datname = current_database()
"""


def copy_application_name(source: PostgresConnection, pipeline_id: int, table_id: int) -> str:
    """The ``application_name`` of one table's copy connections: the source's, with the copy named after it,
    within Postgres's 63 bytes (the copy's part whole). Printable ASCII only: the server rewrites other
    characters, and the watcher would then look for a name no connection has."""
    suffix = f" copy {pipeline_id}/{table_id}"
    base = "".join(c for c in source.application_name if " " <= c <= "~")
    return base[: 63 - len(suffix)] + suffix


class CopyWatch:
    """Watches the source for the ``COPY`` commands of connections named ``application_name`` (a context
    manager: a thread while it is open), handing the growth of their rows to ``advance``."""

    def __init__(
        self,
        source: PostgresConnection,
        application_name: str,
        advance: Callable[[int], None],
        *,
        interval: float = WATCH_INTERVAL_S,
    ) -> None:
        self._source = source
        self._name = application_name
        self._advance = advance
        self._interval = interval
        self._most: dict[tuple[int, datetime, datetime], int] = {}
        self.seen = 0
        """Rows handed to ``advance`` so far."""
        self._stop = threading.Event()
        self._closing = threading.Lock()
        """Held by a look while it hands on, and by closing: after ``__exit__`` nothing is handed on."""
        self._thread = threading.Thread(target=self._run, name="copy-watch", daemon=True)

    def __enter__(self) -> CopyWatch:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        with self._closing:
            self._stop.set()
        self._thread.join(timeout=JOIN_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with connect(self._source) as conn:
                    if conn.info.server_version < PROGRESS_VIEW_SINCE:
                        return
                    while not self._stop.wait(self._interval):
                        self.look(conn.execute(_RUNNING_COPIES, (self._name,)).fetchall())
            except (EtlError, psycopg.Error) as exc:  # the copy itself says what is wrong with the source
                log.debug("copy progress not read from the source", error=str(exc))
            self._stop.wait(self._interval)

    def look(self, running: list[tuple[int, datetime, datetime, int]]) -> None:
        """Take one look's rows (backend pid, its start, its command's start, rows sent) and hand on the growth."""
        with self._closing:
            if self._stop.is_set():
                return
            for pid, started, command_started, rows in running:
                key = (pid, started, command_started)
                self._most[key] = max(self._most.get(key, 0), rows)
            total = sum(self._most.values())
            if total > self.seen:
                self._advance(total - self.seen)
                self.seen = total
