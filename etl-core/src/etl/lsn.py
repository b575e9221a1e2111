"""Log sequence numbers: the position of a record in the Postgres WAL."""

from __future__ import annotations

import re
from typing import Final

_LSN_TEXT: Final = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")


class Lsn(int):
    """A WAL position; an int that prints the way Postgres does (``16/B374D848``)."""

    __slots__ = ()

    MAX: Lsn
    ZERO: Lsn

    @classmethod
    def parse(cls, text: str) -> Lsn:
        match = _LSN_TEXT.match(text.strip())
        if match is None:
            raise ValueError(f"not a Postgres LSN: {text!r} (expected the form 'XXXXXXXX/XXXXXXXX')")
        return cls((int(match.group(1), 16) << 32) | int(match.group(2), 16))

    def __str__(self) -> str:
        return f"{int(self) >> 32:X}/{int(self) & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"Lsn('{self}')"


Lsn.MAX = Lsn(0xFFFFFFFFFFFFFFFF)
Lsn.ZERO = Lsn(0)
