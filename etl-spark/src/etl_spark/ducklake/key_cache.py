"""What finding the stored rows of a batch's keys reads, kept in memory: data files' key columns and
delete files' positions.

A streamed batch's updates and deletes are found by reading the key column of every candidate data
file, and dropping the positions its delete file already holds. When a workload's keys do not grow with
time (updates of old rows), each new file's key bounds span the table, so every batch reads every file
of the table again. A registered file never changes (a delete adds a new delete file; a merge registers
a new data file), so what was read once stays true: this cache keeps the most recently used entries,
up to a number of bytes. Entries are keyed by the file's catalog id with its path: a path registered
again (``ducklake_add_data_files`` of a rewritten file, say) gets a new id. The files a batch writes on
the driver are put in as written once their commit lands, so they are not read back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeAlias

import pyarrow as pa

Values: TypeAlias = pa.ChunkedArray | pa.Array | pa.Table | None
"""An entry: a column, a table, or ``None`` (a data file without the column)."""


class LookupCache:
    """A least-recently-used cache of Arrow values by a key naming a file (its catalog id and path), bounded by
    their bytes.

    Thread-safe: the tables of a batch are planned on several threads. Two threads missing the same
    entry both read it; the second's copy replaces the first's.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, Values] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, read: Callable[[], Values]) -> Values:
        """The values cached under ``key``, read on a miss."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        values = read()
        self.put(key, values)
        return values

    def put(self, key: Hashable, values: Values) -> None:
        """Keep ``values`` under ``key`` (those larger than the whole bound are not kept)."""
        size = _size(values)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._entries:
                self._bytes -= _size(self._entries.pop(key))
            self._entries[key] = values
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= _size(evicted)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes


def _size(values: Values) -> int:
    """An entry's bytes: its values', and a little for the entry itself (so that entries of files without the
    column are bounded too)."""
    return 64 + (0 if values is None else values.nbytes)
