"""What ``etl check`` reports, and what a store or destination plugin adds to it.

A plugin class may define ``preflight(config)``: checks that open what ``etl run`` will open (a file's
directory, a server, a runtime), read-only and creating nothing, so that check fails where the run would;
and ``deep_preflight(config)``: checks that ``etl check --deep`` adds, which may take longer and leave no
more than a probe they remove (a Spark job, a file written into a bucket).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str | None = None

    advisory: bool = False
    """A failed advisory check is reported as WARN and does not fail ``etl check``."""

    @property
    def failed(self) -> bool:
        return not self.ok and not self.advisory

    def line(self) -> str:
        verdict = "PASS" if self.ok else "WARN" if self.advisory else "FAIL"
        text = f"{verdict}  {self.name}: {self.detail}"
        return f"{text}\n      fix: {self.fix}" if self.fix and not self.ok else text


@runtime_checkable
class Preflighted(Protocol):
    """A store or destination class whose ``etl check`` opens what its run will open."""

    @classmethod
    def preflight(cls, config: Any) -> Iterable[Check]:
        """Checks of the validated ``config``: read-only, and nothing is left behind."""
        ...


@runtime_checkable
class DeepPreflighted(Protocol):
    """A store or destination class with checks for ``etl check --deep``."""

    @classmethod
    def deep_preflight(cls, config: Any) -> Iterable[Check]:
        """Slower checks of the validated ``config``: they run what the run runs, and remove what they write."""
        ...


def file_to_create(name: str, path: Path) -> Check:
    """``path`` is a file that exists and is writable, or can be created: its directory exists and is writable."""
    if path.exists():
        if not path.is_file():
            return Check(name, False, f"{path} is not a file", "set the path to a file, not a directory")
        if not os.access(path, os.R_OK | os.W_OK):
            return Check(name, False, f"{path} is not readable and writable", f"chmod u+rw {path}, or run as its owner")
        return Check(name, True, f"{path} exists and is writable")
    parent = path.parent
    if not parent.is_dir():
        return Check(
            name,
            False,
            f"the directory {parent} does not exist",
            f"create it (mkdir -p {parent}) or choose another path",
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        return Check(name, False, f"cannot create {path}: {parent} is not writable", "choose a writable directory")
    return Check(name, True, f"{path} will be created in {parent}")


def writable_directory(name: str, path: Path) -> Check:
    """``path`` is a directory where this process can write a file, or one it can create (as ``etl run``
    would). A probe file is written and removed; a missing directory is not created."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return Check(
            name, False, f"{existing} is a file, so {path} cannot be a directory", "choose a path under a directory"
        )
    probe = existing / f".etl-check-{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        return Check(
            name, False, f"cannot write in {existing}: {exc.strerror or exc}", f"make {existing} writable by this user"
        )
    if existing == path:
        return Check(name, True, f"{path} is writable")
    return Check(name, True, f"{path} will be created under {existing}, which is writable")
