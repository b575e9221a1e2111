"""Running the libpq steps of ``generators`` on a connection's socket: the one place that waits.

Waits are ``select`` calls (the GIL released). A run may have a deadline for the whole step, a longest
silence per wait, and a check called while it waits (at least every ``poll`` seconds) and after each wait,
which raises to give up (a stop request).
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Callable
from typing import Final, TypeVar

from psycopg.pq.abc import PGconn

from etl.postgres.generators import PQGen

T = TypeVar("T")

POLL: Final = 0.5
"""Seconds between calls of a run's ``check`` while it waits."""


class Expired(Exception):
    """A run passed its deadline, or a wait its longest silence (``silent`` tells which)."""

    def __init__(self, silent: bool) -> None:
        super().__init__("no answer within the longest silence" if silent else "deadline passed")
        self.silent = silent


class Waiter:
    """Runs steps on one connection; keeps a selector on its socket (libpq may change the socket while it
    connects: it is looked up at every wait)."""

    def __init__(self, pgconn: PGconn) -> None:
        self._pgconn = pgconn
        self._selector = selectors.DefaultSelector()
        self._fileno = -1
        self._events = 0

    def close(self) -> None:
        self._selector.close()

    def run(
        self,
        step: PQGen[T],
        *,
        deadline: float | None = None,
        silence: float | None = None,
        check: Callable[[], None] | None = None,
    ) -> T:
        """Run ``step`` to its result. ``deadline`` (``time.monotonic()``) bounds the whole run and ``silence`` each
        wait: past either, ``Expired``. ``check`` is called while waiting and after each wait."""
        try:
            events = next(step)
            while True:
                events = step.send(self._wait(events, deadline, silence, check))
        except StopIteration as done:
            result: T = done.value
            return result

    def _wait(
        self, events: int, deadline: float | None, silence: float | None, check: Callable[[], None] | None
    ) -> int:
        fileno = self._pgconn.socket
        if fileno != self._fileno:
            if self._fileno >= 0:
                self._selector.unregister(self._fileno)
            self._selector.register(fileno, events)
            self._fileno, self._events = fileno, events
        elif events != self._events:
            self._selector.modify(fileno, events)
            self._events = events
        quiet_until = None if silence is None else time.monotonic() + silence
        ends = min((t for t in (deadline, quiet_until) if t is not None), default=None)
        while True:
            timeout = None if ends is None else max(0.0, ends - time.monotonic())
            if check is not None:
                timeout = POLL if timeout is None else min(timeout, POLL)
            ready = self._selector.select(timeout)
            if check is not None:
                check()
            if ready:
                return ready[0][1]
            if ends is not None and time.monotonic() >= ends:
                raise Expired(silent=deadline is None or (quiet_until is not None and quiet_until <= deadline))
