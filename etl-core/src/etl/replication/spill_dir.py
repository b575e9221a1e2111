"""A stream worker's spill directory, held by its process, and the removal of those whose process died.

Large streamed transactions spill to files (``streamed``); a process that dies while they are there (a SIGKILL,
the OOM killer: just when transactions are large) cannot remove them, and a pipeline restarted in a loop would
fill the disk. So each directory, ``etl-spill-*`` under the configured base, holds a lock file that its process
keeps locked (``FileLock``): the kernel lets go of it when the process dies, however it dies. A stream worker
removes every directory under its base whose lock was let go (``remove_abandoned``) before it starts; the
directories of live pipelines on the same host stay.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Final

import structlog

from etl.errors import EtlError
from etl.filelock import FileLock

log = structlog.get_logger(__name__)

PREFIX: Final = "etl-spill-"
LOCK: Final = ".lock"


def spill_base(configured: str | None) -> Path:
    """Where spill directories go: ``[batch] spill_directory``, or the system's temporary directory."""
    return Path(configured if configured is not None else tempfile.gettempdir())


class SpillDirectory:
    """A directory of this process's own under ``base``, made on first use and removed by ``close``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._path: Path | None = None
        self._lock: FileLock | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path, self._lock = _make(self.base)
        return self._path

    def close(self) -> None:
        """Remove the directory and everything in it. Idempotent."""
        if self._path is not None:
            _remove(self._path)
            self._path = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None


def _make(base: Path) -> tuple[Path, FileLock]:
    while True:
        try:
            path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
        except OSError as exc:
            raise _unusable(base, exc) from exc
        try:
            lock = FileLock(path / LOCK)
            if lock.try_acquire():
                return path, lock
        except OSError as exc:
            shutil.rmtree(path, ignore_errors=True)
            raise _unusable(base, exc) from exc
        # Another worker's removal of abandoned directories took the lock file before this process locked it.
        shutil.rmtree(path, ignore_errors=True)


def _unusable(base: Path, exc: OSError) -> EtlError:
    return EtlError(
        f"could not make a spill directory in {base}: {exc.strerror or exc}",
        hint="check that [batch] spill_directory exists, has free space, and the pipeline may write in it",
    )


def _remove(path: Path) -> None:
    """Remove a spill directory, its lock file last: a process killed half-way leaves one the next sweep finds."""
    try:
        entries = [entry for entry in path.iterdir() if entry.name != LOCK]
    except OSError:
        return
    for entry in [*entries, path / LOCK]:
        with contextlib.suppress(OSError):
            entry.unlink()
    shutil.rmtree(path, ignore_errors=True)


def remove_abandoned(base: Path) -> list[Path]:
    """Remove the spill directories under ``base`` whose process died; those removed."""
    removed = []
    try:
        candidates = sorted(base.glob(PREFIX + "*"))
    except OSError:  # an unreadable base: nothing to tidy; making a directory there says what is wrong
        return []
    for path in candidates:
        if FileLock.abandoned(path / LOCK):
            _remove(path)
            removed.append(path)
    if removed:
        log.info("removed spill directories of stopped processes", directories=[str(p) for p in removed])
    return removed
