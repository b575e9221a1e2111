"""Work a destination does on its own between batches, on a daemon thread.

Each round asks for the steps due and runs them one at a time, each holding the lock each batch holds
while it writes: a step never runs during a batch, and a batch waits for one step at most. A failed
step is logged and tried again in a later round: the batches report the lake's faults themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Final

import structlog

log = structlog.get_logger(__name__)

UPKEEP_SECONDS: Final = 5.0
"""How often the thread looks for work, at most."""

Step = Callable[[], None]


class Upkeep:
    """Every ``every`` seconds, runs the steps ``due`` returns, each holding ``lock``, until ``stop``."""

    def __init__(self, due: Callable[[], Sequence[Step]], every: float, lock: threading.Lock) -> None:
        self._due = due
        self._every = every
        self._lock = lock
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
                with self._lock:
                    if self._stopping.is_set():
                        return
                    try:
                        step()
                    except Exception:
                        log.warning("ducklake upkeep step failed; trying again later", exc_info=True)
