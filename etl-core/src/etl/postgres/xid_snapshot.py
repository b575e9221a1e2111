"""What an MVCC snapshot sees, from ``pg_current_snapshot()``'s text, for transaction ids of the change stream.

A snapshot ``xmin:xmax:xip`` sees a committed transaction unless its id is ``xmax`` or later, or in ``xip``: both
are transactions not yet completed when it was taken. Postgres leaves out of ``xip`` every transaction at or above
``xmax`` (one past the last completed), so a transaction whose commit is in the WAL, and streamed, but not yet
visible (waiting for a synchronous standby, say) is at or above ``xmax`` when it is the newest, and in ``xip``
otherwise. The change stream and ``pg_stat_activity`` name a transaction by its 32-bit id, which is matched to the
snapshot's 64-bit ones by their low 32 bits: every transaction not frozen is within 2^31 of ``xmax``, so the low
bits name one 64-bit id near it (below ``xmax`` by wraparound, a few above it). Sans-IO.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_LOW = 0xFFFFFFFF
_HALF = 1 << 31
_FORM = re.compile(r"(\d+):(\d+):(\d+(?:,\d+)*)?")


@dataclass(frozen=True)
class XidSnapshot:
    xmin: int
    """The oldest transaction still running (64-bit): every one before it has completed."""
    xmax: int
    """One past the last completed transaction (64-bit): none at or above it has completed."""
    xip: frozenset[int]
    """The 64-bit ids below ``xmax`` of the transactions in progress when the snapshot was taken."""

    @classmethod
    def parse(cls, text: str) -> XidSnapshot:
        """``pg_current_snapshot()::text``: ``xmin:xmax:xip1,xip2,...`` (the list may be empty)."""
        match = _FORM.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"not a pg_snapshot: {text!r}")
        xmin, xmax, xip = match.groups()
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in (xip or "").split(",") if x))

    def full(self, xid: int) -> int:
        """The 64-bit id of the 32-bit transaction id ``xid``: the one with its low 32 bits nearest ``xmax``."""
        offset = (xid - self.xmax) & _LOW
        return self.xmax + offset - (1 << 32 if offset >= _HALF else 0)

    def saw_running(self, xid: int) -> bool:
        """Whether the 32-bit transaction ``xid`` had not completed when the snapshot was taken: a transaction whose
        changes the change stream delivered that the snapshot does not see."""
        return not self.saw_ended(self.full(xid))

    def saw_ended(self, xid: int) -> bool:
        """Whether the 64-bit transaction ``xid`` had completed (committed or aborted) when the snapshot was taken."""
        return xid < self.xmax and xid not in self.xip

    def still_running(self, xids: Iterable[int]) -> frozenset[int]:
        """Those of the 64-bit ``xids`` (the transactions of ``running_xids``, say) the snapshot saw not completed."""
        return frozenset(x for x in xids if not self.saw_ended(x))


def running_xids(snapshot: XidSnapshot, others: Iterable[int]) -> frozenset[int]:
    """Every transaction running when ``snapshot`` was taken, as 64-bit ids: its ``xip``, and those at or above its
    ``xmax`` among ``others``, the 32-bit ids of the transactions in progress just after it (``pg_stat_activity``'s
    ``backend_xid``, ``pg_prepared_xacts``'s ``transaction``), which the snapshot cannot list."""
    above = (snapshot.full(x) for x in others)
    return snapshot.xip | frozenset(x for x in above if x >= snapshot.xmax)
