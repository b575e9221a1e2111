"""An exclusive, non-blocking OS file lock that the kernel releases when its holder dies (a SIGKILL included)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class FileLock:
    """``flock`` on a file of its own; the file keeps the holder's process id for messages."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if free; False when another open file (any process) holds it."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def holder(self) -> str | None:
        """The process id the current holder wrote, if readable."""
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = self.path.read_text().strip()
            return text if text.isdigit() else None
        return None

    @staticmethod
    def abandoned(path: Path) -> bool:
        """Whether the lock file at ``path`` names a holder that no longer holds it: its process died.

        A file that names no holder yet is not abandoned: its maker is between creating and locking it.
        """
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)  # writable: NFS locks need it for an exclusive lock
        except OSError:  # gone, not a file, or not ours
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return os.read(fd, 32).strip().isdigit()
        except OSError:  # held (BlockingIOError), or not lockable here
            return False
        finally:
            os.close(fd)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the only descriptor releases the flock
