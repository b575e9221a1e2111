"""What an MVCC snapshot sees, from ``pg_current_snapshot()``'s text, for transaction ids of the change stream.

A snapshot ``xmin:xmax:xip`` sees a committed transaction unless its id is ``xmax`` or later (it began after the
snapshot) or in ``xip`` (it was running). The change stream names each transaction by its 32-bit id, which is
matched to the snapshot's 64-bit ones by their low 32 bits: every id a snapshot lists is within 2^31 of its
``xmax``, so the low bits name one of them. Sans-IO.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LOW = 0xFFFFFFFF
_FORM = re.compile(r"\d+:\d+:(\d+(,\d+)*)?")


@dataclass(frozen=True)
class XidSnapshot:
    running: frozenset[int]
    """The low 32 bits of each transaction id in progress when the snapshot was taken."""

    @classmethod
    def parse(cls, text: str) -> XidSnapshot:
        """``pg_current_snapshot()::text``: ``xmin:xmax:xip1,xip2,...`` (the list may be empty)."""
        if not _FORM.fullmatch(text.strip()):
            raise ValueError(f"not a pg_snapshot: {text!r}")
        xip = text.strip().split(":")[2]
        return cls(frozenset(int(x) & _LOW for x in xip.split(",") if x))

    def saw_running(self, xid: int) -> bool:
        """Whether the 32-bit transaction ``xid`` was in progress when the snapshot was taken: a transaction
        committed by then, whose changes the change stream already delivered, that the snapshot does not see."""
        return xid & _LOW in self.running

    def finished_since(self, earlier: XidSnapshot) -> bool:
        """Whether every transaction running at ``earlier`` has ended by this snapshot."""
        return not (earlier.running & self.running)
