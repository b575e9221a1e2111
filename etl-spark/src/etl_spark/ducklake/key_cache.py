"""Data files' key columns kept in memory, for finding the stored rows of a batch's keys.

A streamed batch's updates and deletes are found by reading the key column of every candidate data
file. When a workload's keys do not grow with time (updates of old rows), each new file's key bounds
span the table, so every batch reads every file of the table again. A registered data file never
changes (a delete is a file of its own; a merge registers a new file), so a key column read once stays
true: this cache keeps the most recently used ones, up to a number of bytes. Entries are keyed by the
file's catalog id with its path: a path registered again (``ducklake_add_data_files`` of a rewritten
file, say) gets a new id.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import pyarrow as pa


class KeyColumns:
    """A least-recently-used cache of key columns by (data file id, path, column id), bounded by their bytes.

    Thread-safe: the tables of a batch are planned on several threads. Two threads missing the same
    entry both read it; the second's copy replaces the first's.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, pa.ChunkedArray | None] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable, read: Callable[[], pa.ChunkedArray | None]) -> pa.ChunkedArray | None:
        """The values cached under ``key`` (``None``: the file does not hold the column), read on a miss."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        values = read()
        size = _size(values)
        if size > self.max_bytes:
            return values
        with self._lock:
            if key in self._entries:
                self._bytes -= _size(self._entries.pop(key))
            self._entries[key] = values
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= _size(evicted)
        return values

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes


def _size(values: pa.ChunkedArray | None) -> int:
    """An entry's bytes: its values', and a little for the entry itself (so that entries of files without the
    column are bounded too)."""
    return 64 + (0 if values is None else values.nbytes)
