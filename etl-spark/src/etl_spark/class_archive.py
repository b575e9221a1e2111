"""A class-data-sharing archive of the Spark driver JVM's classes, kept in the user's cache directory.

A JVM that starts Spark loads, verifies and links some ten thousand classes: most of the CPU of a
session's start. Started from an archive of them (Java's AppCDS, ``-XX:SharedArchiveFile``), it maps them
ready to use and starts in about 60% of the time. An archive fits one Java installation, one set of Spark
jars and one set of ``JDK_JAVA_OPTIONS``: its name is a digest of them. When none fits yet, the process
starting Spark builds one in the background (``python -m etl_spark.build_class_archive``): a small local session
runs a query and stops, and its JVM writes the archive as it exits. A lock keeps to one builder at a time; a
builder that dies leaves a ``.part`` file, which the next one removes. A JVM that finds the archive unfit
(a JDK updated in place, say) starts without it, silently. The executor JVMs of a ``local-cluster`` master
run on this machine with the same jars, and start from the archive too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import structlog

from etl.api import FileLock

log = structlog.get_logger(__name__)

UNUSED_DAYS = 7
"""An archive no JVM started from for this long is removed when another one is built (each is ~150 MB)."""


def cache_dir() -> Path:
    """Where archives are kept: ``$XDG_CACHE_HOME/etl-spark``, by default ``~/.cache/etl-spark``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "etl-spark"


class ClassArchive:
    """The archive for the JVM that ``java`` runs with the Spark jars in ``jars``. A JVM checks that an archive
    fits it and ignores one that does not, silently: so the name digests the JVM's own library too (a JDK
    updated in place keeps its ``java``)."""

    def __init__(self, java: Path, jars: Path, directory: Path | None = None) -> None:
        home = java.resolve().parent.parent
        digest = hashlib.sha256()
        for part in (java.resolve(), *home.glob("lib/*/libjvm.so"), *sorted(jars.glob("*.jar"))):
            stat = part.stat()
            digest.update(f"{part}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        for variable in ("JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS"):
            digest.update(f"{variable}={os.environ.get(variable, '')}\n".encode())
        self.path = (directory or cache_dir()) / f"spark-{digest.hexdigest()[:20]}.jsa"
        self.part = self.path.with_suffix(".part")

    def use_option(self) -> str | None:
        """The JVM option that starts from the archive (marked as used now); None while there is none."""
        try:
            os.utime(self.path)
        except OSError:  # none yet, or a cache directory this user may not write: read as it is
            if not self.path.is_file():
                return None
        return f'"-XX:SharedArchiveFile={self.path}"'

    def dump_option(self) -> str:
        """The JVM option that writes the archive (to ``part``) as the JVM exits."""
        return f'"-XX:ArchiveClassesAtExit={self.part}"'

    def lock(self) -> FileLock:
        return FileLock(self.path.with_suffix(".lock"))

    def build_in_background(self) -> None:
        """Start a builder unless one runs; it outlives this process if need be, and its output is dropped."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = self.lock()
            if not lock.try_acquire():  # a builder runs
                return
            lock.release()  # the builder takes it; two that race both check again under it
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY_")}  # a JVM of its own
            subprocess.Popen(
                [sys.executable, "-m", "etl_spark.build_class_archive"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C meant for the pipeline does not cut a build short
            )
        except OSError as exc:  # a read-only home, say: Spark starts as fast as it would without
            log.info("no class archive for spark", reason=str(exc))
            return
        log.info("building a class archive for spark in the background", path=str(self.path))

    def adopt(self) -> bool:
        """Move a complete ``part`` into place (the builder calls this once its JVM exited cleanly), and remove
        the archives of other JVMs and jars (a replaced JDK, an old virtualenv) unused for ``UNUSED_DAYS``."""
        if not (self.part.is_file() and self.part.stat().st_size > 0):
            return False
        os.replace(self.part, self.path)
        stale = time.time() - UNUSED_DAYS * 86400
        for other in self.path.parent.glob("spark-*.jsa"):
            with contextlib.suppress(OSError):  # another builder's cleanup was first
                if other != self.path and other.stat().st_mtime < stale:
                    other.unlink()
        return True
