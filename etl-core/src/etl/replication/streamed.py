"""Buffers for in-progress transactions streamed by pgoutput protocol 2, spilled to disk past a threshold.

Between StreamStart and StreamStop the server sends changes of a transaction that has not
committed yet, in chunks, possibly interleaved with other transactions. They are kept here as raw
pgoutput payloads until StreamCommit releases them in order, or StreamAbort drops the whole
transaction or one subtransaction. Past ``spill_threshold_bytes`` held in memory (across all
transactions) the largest buffers move to one file per transaction (length-prefixed payloads,
appended), in the worker's spill directory (``spill_dir``), so memory stays bounded however large the
transactions grow.

A subtransaction abort cuts the transaction back to where that subtransaction's first change was
recorded, as Postgres's own apply worker does: changes recorded after that point belong to it or
to subtransactions nested in it, which the abort also ends.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Final

import structlog

from etl.errors import EtlError
from etl.replication.spill_dir import SpillDirectory

log = structlog.get_logger(__name__)

_LENGTH: Final = struct.Struct("!I")
_READ_BLOCK: Final = 1 << 20


class _Transaction:
    __slots__ = ("count", "file", "file_count", "memory", "memory_bytes", "path", "size", "subxacts", "xid")

    def __init__(self, xid: int) -> None:
        self.xid = xid
        self.memory: list[bytes] = []
        self.memory_bytes = 0
        self.count = 0
        """Payloads recorded (in the file, then in memory)."""
        self.size = 0
        """Bytes of all payloads as framed in the file: where the next one would start."""
        self.path: Path | None = None
        self.file: BinaryIO | None = None
        self.file_count = 0
        self.subxacts: dict[int, tuple[int, int]] = {}
        """subxid -> (index, framed offset) of its first recorded change."""


class StreamedTransactions:
    """Raw payloads of streamed in-progress transactions, by toplevel xid."""

    def __init__(self, spill_dir: SpillDirectory, spill_threshold_bytes: int) -> None:
        if spill_threshold_bytes < 0:
            raise ValueError("spill_threshold_bytes must not be negative")
        self._spill_dir = spill_dir
        self._threshold = spill_threshold_bytes
        self._transactions: dict[int, _Transaction] = {}
        self._memory = 0

    @property
    def memory_bytes(self) -> int:
        """Payload bytes held in memory, across transactions."""
        return self._memory

    def __len__(self) -> int:
        """Transactions with buffered changes."""
        return len(self._transactions)

    def append(self, xid: int, subxid: int, payload: bytes) -> None:
        """Record a change of toplevel transaction ``xid``, made in (sub)transaction ``subxid``."""
        transaction = self._transactions.get(xid)
        if transaction is None:
            transaction = self._transactions[xid] = _Transaction(xid)
        if subxid != xid and subxid not in transaction.subxacts:
            transaction.subxacts[subxid] = (transaction.count, transaction.size)
        transaction.memory.append(payload)
        transaction.memory_bytes += len(payload)
        transaction.count += 1
        transaction.size += _LENGTH.size + len(payload)
        self._memory += len(payload)
        if self._memory > self._threshold:
            self._spill()

    def abort(self, xid: int, subxid: int) -> None:
        """Drop transaction ``xid`` (``subxid == xid``) or only subtransaction ``subxid`` and those nested in it."""
        transaction = self._transactions.get(xid)
        if transaction is None:
            return
        if subxid == xid:
            del self._transactions[xid]
            self._memory -= transaction.memory_bytes
            _remove(transaction)
            return
        first = transaction.subxacts.get(subxid)
        if first is None:
            return  # the subtransaction recorded no change
        index, offset = first
        if index >= transaction.file_count:
            kept = index - transaction.file_count
            dropped = sum(map(len, transaction.memory[kept:]))
            del transaction.memory[kept:]
        else:  # it began in the file: cut the file there; everything in memory came later
            dropped = transaction.memory_bytes
            transaction.memory.clear()
            with _spill_file(transaction, "truncate") as file:
                file.flush()
                file.truncate(offset)
                file.seek(offset)
            transaction.file_count = index
        transaction.memory_bytes -= dropped
        self._memory -= dropped
        transaction.count, transaction.size = index, offset
        transaction.subxacts = {s: p for s, p in transaction.subxacts.items() if p[0] < index}

    def commit(self, xid: int) -> Iterator[bytes]:
        """The payloads of transaction ``xid`` in the order recorded; they are freed as the iterator finishes."""
        transaction = self._transactions.pop(xid, None)
        if transaction is None:
            return iter(())
        self._memory -= transaction.memory_bytes
        return self._replay(transaction)

    def close(self) -> None:
        """Drop every buffered transaction and remove the spill directory. Idempotent."""
        for transaction in self._transactions.values():
            _remove(transaction)
        self._transactions.clear()
        self._memory = 0
        self._spill_dir.close()

    # -- internals -------------------------------------------------------------------------------------
    def _spill(self) -> None:
        """Move the largest in-memory buffers to their files until at most half the threshold stays in memory."""
        while self._memory > self._threshold // 2:
            transaction = max(self._transactions.values(), key=lambda t: t.memory_bytes)
            if transaction.path is None:
                transaction.path = self._spill_dir.path / f"xid-{transaction.xid}.pgoutput"
            with _spill_file(transaction, "write") as file:
                for payload in transaction.memory:  # frame by frame: no second copy of the buffer in memory
                    file.write(_LENGTH.pack(len(payload)))
                    file.write(payload)
                file.flush()
            log.debug(
                "spilled streamed transaction",
                xid=transaction.xid,
                payloads=len(transaction.memory),
                bytes=transaction.memory_bytes,
                path=str(transaction.path),
            )
            self._memory -= transaction.memory_bytes
            transaction.file_count = transaction.count
            transaction.memory.clear()
            transaction.memory_bytes = 0

    @staticmethod
    def _replay(transaction: _Transaction) -> Iterator[bytes]:
        try:
            if transaction.file is not None:
                with _spill_file(transaction, "read") as file:
                    file.flush()
                    file.seek(0)
                    read = 0
                    for payload in _frames(file, transaction.file_count):
                        read += 1
                        yield payload
                    if read != transaction.file_count:
                        raise EtlError(
                            f"spill file {transaction.path} of transaction {transaction.xid} is truncated",
                            hint="the spill directory was changed by something else; restart the pipeline",
                        )
            yield from transaction.memory
        finally:
            _remove(transaction)


@contextlib.contextmanager
def _spill_file(transaction: _Transaction, action: str) -> Iterator[BinaryIO]:
    """The transaction's spill file (created on first use); I/O errors become an ``EtlError`` with a hint."""
    try:
        if transaction.file is None:
            assert transaction.path is not None
            transaction.file = transaction.path.open("w+b")
        yield transaction.file
    except OSError as exc:
        raise EtlError(
            f"could not {action} the spill file {transaction.path} of streamed transaction"
            f" {transaction.xid}: {exc.strerror or exc}",
            hint="check the free space and permissions of the spill directory ([batch] spill_directory)",
        ) from exc


def _frames(file: BinaryIO, count: int) -> Iterator[bytes]:
    """Up to ``count`` length-prefixed payloads from ``file``, read in blocks (fewer if the file ends first)."""
    block, pos = b"", 0
    for _ in range(count):
        if len(block) - pos < _LENGTH.size:
            block, pos = block[pos:] + file.read(_READ_BLOCK), 0
            if len(block) < _LENGTH.size:
                return
        start = pos + _LENGTH.size
        end = start + _LENGTH.unpack_from(block, pos)[0]
        if end > len(block):  # the payload goes on past this block
            block, start, end = block[pos:] + file.read(max(_READ_BLOCK, end - len(block))), start - pos, end - pos
            if end > len(block):
                return
        yield block[start:end]
        pos = end


def _remove(transaction: _Transaction) -> None:
    if transaction.file is not None:
        transaction.file.close()
        transaction.file = None
    if transaction.path is not None:
        with contextlib.suppress(FileNotFoundError):
            transaction.path.unlink()
        transaction.path = None
    transaction.memory.clear()
