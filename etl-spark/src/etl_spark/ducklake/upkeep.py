"""Work a destination does on its own between batches, on a daemon thread.

The thread takes the lock each batch holds while it writes, so its work never runs during a batch and a
batch waits for it at most one step. A failed step is logged and tried again at the next tick: the
batches report the lake's faults themselves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

import structlog

log = structlog.get_logger(__name__)

UPKEEP_SECONDS: Final = 5.0
"""How often the thread looks for work, at most."""


class Upkeep:
    """Runs ``work`` every ``every`` seconds, holding ``lock``, until ``stop``."""

    def __init__(self, work: Callable[[], None], every: float, lock: threading.Lock) -> None:
        self._work = work
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
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self._work()
                except Exception:
                    log.warning("ducklake upkeep failed; trying again later", exc_info=True)
