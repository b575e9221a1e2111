"""Work a destination does on its own between batches, on a daemon thread.

Each round asks for the steps due and runs them one at a time, taking turns with the batches
(``Turns``): a step never runs during a batch, a batch waiting goes before the next step, so it waits
for one step at most. A failed step is logged and tried again in a later round: the batches report the
lake's faults themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Final

import structlog

log = structlog.get_logger(__name__)

UPKEEP_SECONDS: Final = 5.0
"""How often the thread looks for work, at most."""

Step = Callable[[], None]


class Turns:
    """The lock batches and upkeep steps take in turn; a batch waiting for it goes first (a plain lock lets the
    thread that just released it take it again)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._batches_waiting = 0

    @contextmanager
    def batch(self) -> Iterator[None]:
        with self._changed:
            self._batches_waiting += 1
        try:
            self._lock.acquire()
        finally:
            with self._changed:
                self._batches_waiting -= 1
                self._changed.notify_all()
        try:
            yield
        finally:
            self._lock.release()

    @contextmanager
    def step(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self._batches_waiting == 0)
            self._lock.acquire()
        try:
            yield
        finally:
            self._lock.release()


class Upkeep:
    """Every ``every`` seconds, runs the steps ``due`` returns, each in its turn, until ``stop``."""

    def __init__(self, due: Callable[[], Sequence[Step]], every: float, turns: Turns) -> None:
        self._due = due
        self._every = every
        self._turns = turns
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ducklake-upkeep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the step under way, if any."""
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(self._every):
            try:
                steps = self._due()
            except Exception:
                log.warning("ducklake upkeep could not find its work; trying again later", exc_info=True)
                continue
            for step in steps:
                with self._turns.step():
                    if self._stopping.is_set():
                        return
                    try:
                        step()
                    except Exception:
                        log.warning("ducklake upkeep step failed; trying again later", exc_info=True)
