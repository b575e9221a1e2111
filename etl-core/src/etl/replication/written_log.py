"""The info line that says changes arrive: one per durable batch, at most one per interval on a busy stream.

A batch written within ``every_s`` of the last line is added to the next line, which sums the batches since
the last one (``batches=``); what is pending when the stream stops is logged then.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import structlog

from etl.events import CHANGE_KINDS
from etl.lsn import Lsn
from etl.schema import TableId

log = structlog.get_logger(__name__)

EVERY_S = 10.0


class WrittenLog:
    def __init__(self, worker: str, every_s: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._worker = worker
        self._every_s = every_s
        self._clock = clock
        self._last_line = float("-inf")
        self._batches = 0
        self._counts: Counter[str] = Counter()
        self._tables: set[TableId] = set()
        self._seconds = 0.0
        self._lsn = Lsn.ZERO

    def written(self, counts: dict[str, int], tables: set[TableId], seconds: float, lsn: Lsn) -> None:
        """A batch is durable: ``counts`` of its changes by kind, its ``tables``, its write time, its position."""
        self._batches += 1
        self._counts.update(counts)
        self._tables |= tables
        self._seconds += seconds
        self._lsn = max(self._lsn, lsn)
        if self._clock() - self._last_line >= self._every_s:
            self.flush()

    def flush(self) -> None:
        """Log what is pending, if anything."""
        if not self._batches:
            return
        log.info(
            "changes written",
            worker=self._worker,
            batches=self._batches,
            **{f"{kind}s": self._counts[kind] for kind in CHANGE_KINDS.values()},
            tables=len(self._tables),
            write_s=round(self._seconds, 3),
            lsn=str(self._lsn),
        )
        self._last_line = self._clock()
        self._batches, self._seconds = 0, 0.0
        self._counts.clear()
        self._tables.clear()
