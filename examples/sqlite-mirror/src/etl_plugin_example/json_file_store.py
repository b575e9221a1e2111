"""The ``json_file`` store: every pipeline's state in one JSON file.

Built on ``etl.store.snapshot.SnapshotStore``, which keeps the state in memory with the semantics of
the built-in stores and hands over the whole state after each change. The file holds one document
per pipeline id::

    {"format": 1, "pipelines": {"7": {...the SnapshotStore document of pipeline 7...}}}

Saving replaces the file atomically (write a temporary file, fsync, rename, fsync the directory)
while holding an ``flock`` on ``<path>.write-lock``, and merges with what the file holds then, so
pipelines sharing the file keep each other's documents. The pipeline lock is an ``flock`` on
``<path>.pipeline-<id>.lock``, released by the kernel when its holder dies.

Opening reads the pipeline's document without the lock, for readers such as ``etl status``; taking the lock
reads it again, since only what is read under the lock is the state the holder may go on from.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from etl.api import PipelineLockedError, SnapshotStore, StoreError
from pydantic import BaseModel, ConfigDict, Field

FILE_FORMAT = 1


class JsonFileStore(SnapshotStore):
    name: ClassVar[str] = "json_file"

    class Config(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        path: Path = Field(description="the JSON file; created on the first write (its directory must exist)")

    @classmethod
    def from_config(cls, config: Config, pipeline_id: int) -> JsonFileStore:
        return cls(config.path, pipeline_id)

    def __init__(self, path: str | Path, pipeline_id: int) -> None:
        super().__init__(pipeline_id)
        self.path = Path(path)
        self._lock_fd: int | None = None
        self._load()  # for readers that never take the lock; acquire_lock loads again

    def describe(self) -> str:
        return f"JSON file store {self.path}"

    # -- the pipeline lock -----------------------------------------------------------------------------------
    def acquire_lock(self) -> None:
        """Take the pipeline lock, then read the state again.

        What this store read when it opened may be stale: another process may have held the lock then and
        written until it let go. Read under the lock, the state is the previous holder's last and nobody
        else changes it; going on from the stale one would write it over the previous holder's changes.
        """
        with self._mutex:
            self._check_open()  # a closed store (say, one whose document was unreadable) takes no lock
            if self._lock_fd is not None:
                return
            lock_path = self.path.with_name(f"{self.path.name}.pipeline-{self.pipeline_id}.lock")
            fd = self._open(lock_path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip()
                os.close(fd)
                held_by = f" (process {holder} holds {lock_path})" if holder.isdigit() else ""
                raise PipelineLockedError(
                    f"pipeline {self.pipeline_id} is already running against the {self.describe()}{held_by}",
                    hint=f"another `etl run` for pipeline {self.pipeline_id} is running; stop it first",
                ) from None
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self._lock_fd = fd
            try:
                self._load()
            except BaseException:
                self.close()  # keep neither the lock nor a half-read state that a write would save
                raise

    def _release(self) -> None:
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            os.close(fd)  # closing the only descriptor releases the flock

    # -- the file ----------------------------------------------------------------------------------------------
    def _load(self) -> None:
        """Replace the cache with the pipeline's document in the file (an empty state when it has none)."""
        self._restore_document(self._read().get(str(self.pipeline_id)))

    def _save_document(self, document: dict[str, Any]) -> None:
        with self._write_lock():
            pipelines = self._read()
            pipelines[str(self.pipeline_id)] = document
            temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            with open(temporary, "w", encoding="utf-8") as out:
                json.dump({"format": FILE_FORMAT, "pipelines": pipelines}, out, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)  # readers see the old file or the new one, never a mix
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)  # make the rename itself durable
            finally:
                os.close(directory)

    def _read(self) -> dict[str, Mapping[str, Any]]:
        """Every pipeline's document in the file (none when the file does not exist yet)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StoreError(
                f"cannot read the {self.describe()}: {exc}", hint="check the path and its permissions"
            ) from None
        try:
            content = json.loads(text)
            if content["format"] != FILE_FORMAT:
                raise ValueError(f"format {content['format']!r}, expected {FILE_FORMAT}")
            pipelines = dict(content["pipelines"])
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(
                f"{self.path} is not a state file this version of the JSON file store can read: {exc}",
                hint="point `path` at another file, or restore the file from a backup",
            ) from None
        return pipelines

    @contextlib.contextmanager
    def _write_lock(self) -> Iterator[None]:
        """Serialise read-merge-write of the file across every process and instance sharing it."""
        fd = self._open(self.path.with_name(f"{self.path.name}.write-lock"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held for one save: milliseconds
            yield
        finally:
            os.close(fd)

    def _open(self, path: Path) -> int:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(
                f"cannot open {path} for the {self.describe()}: {exc.strerror}",
                hint="the directory of `path` must exist and be writable",
            ) from None
