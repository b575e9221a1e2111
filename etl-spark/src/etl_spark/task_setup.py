"""What a Python task of ours sets up in its Spark worker before it works.

Spark reuses a Python worker for many tasks, and before each it calls ``importlib.invalidate_caches()``
(``pyspark.worker_util.setup_spark_files``). On Python 3.11 and 3.12 that makes every zip importer
read its archive's whole directory again: sixteen of them in a worker (``pyspark.zip``, the
``py4j`` zip, the spark-core jar with its 5,000 entries, and the packages imported from them), about
70 ms per task on a quiet machine, more than a tenth of a copy task. Python 3.13 reads an archive again
only when it changed (seen on 3.13.0: once at the first call, then not while the archive is unchanged).
``prepare_task`` gives earlier Pythons the same cost: an archive's directory is read again only when
the archive changed on disk.
"""

from __future__ import annotations

import os
import sys
import threading
import zipimport
from collections.abc import Callable
from typing import Final

import pyarrow as pa

_LAZY_ZIP_CACHES: Final = sys.version_info >= (3, 13)
_lock = threading.Lock()
_installed = False


def prepare_task() -> None:
    """Call first in each task: zip importers that re-read only what changed, and pyarrow's thread pool
    sized to the task's cores."""
    if not _LAZY_ZIP_CACHES:
        _check_archives_before_reading()
    _use_task_cpus()


def _use_task_cpus() -> None:
    """Size pyarrow's thread pool (CSV parsing, Parquet encoding) to the cores Spark gave the task
    (``spark.task.cpus``), not to the machine's: executors run one task per core at once, and pools of
    every core's size in each of them contend (measured on the copy bench, about a quarter slower)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None:
        pa.set_cpu_count(max(1, context.cpus()))


def _check_archives_before_reading() -> None:
    """Make ``zipimporter.invalidate_caches`` re-read an archive only when it changed (its inode, size or mtime)
    since that importer last read it. Once per process; importers existing now were refreshed just before the
    task started, so they count as read."""
    global _installed
    with _lock:
        if _installed:
            return
        for finder in list(sys.path_importer_cache.values()):
            if isinstance(finder, zipimport.zipimporter):
                setattr(finder, _READ_AS, _stamp(finder.archive))
        zipimport.zipimporter.invalidate_caches = _when_changed(zipimport.zipimporter.invalidate_caches)  # type: ignore[method-assign,assignment]
        _installed = True


_READ_AS: Final = "_etl_read_as"
"""The attribute on each zip importer that holds the stamp of its archive when it last read it."""


def _when_changed(invalidate: Callable[[zipimport.zipimporter], None]) -> Callable[[zipimport.zipimporter], None]:
    def invalidate_caches(self: zipimport.zipimporter) -> None:
        stamp = _stamp(self.archive)
        if stamp is not None and getattr(self, _READ_AS, None) == stamp:
            return
        invalidate(self)
        setattr(self, _READ_AS, stamp)

    return invalidate_caches


def _stamp(path: str) -> tuple[int, int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns, status.st_size
