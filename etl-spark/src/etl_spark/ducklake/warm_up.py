"""What a start does ahead, on a thread of its own, so that the first batch does not: Arrow's first use, the
key lookups, and the imports of the Spark tasks' Python workers.

The first Parquet write of a process, its first grouping (Acero's thread pool) and first compute kernels cost a
tenth of a second or more, once; ``warm_arrow`` spends it on a row of nothing.

A batch's updates and deletes find their stored rows by reading the key column of each candidate data file and
its delete file's positions (``storage.LakeStorage.positions_of_keys``), kept in the lookup cache from then on.
After a start the cache is empty, and the first batch would read them all inside its write (a tenth of a second
per million rows here, more from object storage). So they are read at the start, while the stream begins, for
the tables the store says are copied, as far as the cache holds them.

A Python worker of Spark's imports the modules of the first task of ours it runs (the catalog's, SQLAlchemy's and
its driver's for a flush of inlined rows, the writers' for a copy), seconds of CPU that the first such task (the
first flush after a start: 7 s of a 100,000-row flush, 0.8 s later) would spend while the stream waits for it. So
a small job imports them in the workers, ``WORKERS_AFTER_S`` after the start.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from etl.api import Store
from etl_spark.ducklake.catalog import Catalog
from etl_spark.ducklake.catalog.engine import engine_for
from etl_spark.ducklake.plan import searchable
from etl_spark.ducklake.storage import LakeStorage

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)

WORKERS_AFTER_S = 20.0
"""How long after the start the workers are warmed: once the start's own work (the session's start, the copies'
planning, the first batches) is done, and well before a first flush of inlined rows is due. A pipeline that stops
sooner warms none."""

TASK_MODULES = (
    "etl_spark.ducklake.inline_flush",
    "etl_spark.ducklake.storage",
    "etl_spark.ducklake.copy_job",
    "etl_spark.copy_tasks",
)
"""What our tasks' functions come from: a worker imports them (and what they import) to unpickle its first task."""


def warm_lookups(catalog: Catalog, storage: LakeStorage, store: Store, stop: threading.Event) -> None:
    """Read the key lookups of each copied table with a one-column integer or text key into ``storage``'s cache,
    until it is full or ``stop`` is set."""
    copied = [t for t, state in store.get_table_states().items() if state.kind.copied]
    files = 0
    for table_id in copied:
        schema = store.get_table_schema(table_id)
        handle = catalog.handle(table_id)
        if schema is None or handle is None or len(schema.key_columns) != 1:
            continue
        name = schema.key_columns[0].name
        column = next((c for c in handle.table.columns if c.name == name), None)
        if column is None or not searchable(column):
            continue
        data_files = catalog.data_files(handle.table)
        if not storage.warm(column, data_files, stop):
            break
        files += len(data_files)
    log.debug("key lookups read ahead", files=files, cached_bytes=storage.lookups.nbytes)


def warm_arrow() -> None:
    """Write and read back a one-row Parquet file in memory, group it, and look a value up: what every batch's plan
    does first."""
    table = pa.table({"file_path": pa.array(["f"]), "pos": pa.array([0], pa.int64())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    read = pq.read_table(pa.BufferReader(sink.getvalue()))
    read.group_by("file_path").aggregate([("pos", "list")])
    pc.take(read, pc.sort_indices(read, [("pos", "descending")]))
    pc.indices_nonzero(pc.is_in(read["pos"], value_set=pa.array([0], pa.int64())))


WARM_UP_GROUP = "etl-warm-up"
"""The Spark job group of ``warm_workers``' job."""

_warmed: set[str] = set()
"""The applications (Spark sessions) whose workers were warmed: once each, however many destinations start."""
_warmed_lock = threading.Lock()


def warm_workers(spark: SparkSession, catalog_url: str) -> None:
    """Once per session, run a task on each of its cores that imports what our tasks import, the catalog's driver
    too."""
    context = spark.sparkContext
    with _warmed_lock:
        if context.applicationId in _warmed:
            return
        _warmed.add(context.applicationId)
    slots = max(1, context.defaultParallelism)
    context.setJobGroup(WARM_UP_GROUP, "import the modules of etl's tasks in the Python workers")  # this thread's
    try:
        context.parallelize(range(slots), slots).mapPartitions(partial(_import_task_modules, catalog_url)).count()
    finally:  # the thread's later jobs are in no group (Spark removes a local property set to null)
        for key in ("spark.jobGroup.id", "spark.job.description"):
            context.setLocalProperty(key, None)  # type: ignore[arg-type]


def _import_task_modules(catalog_url: str, _rows: Iterable[int]) -> Iterator[int]:
    for name in TASK_MODULES:
        importlib.import_module(name)
    engine_for(catalog_url).dispose()  # loads the dialect and its driver; connects to nothing
    yield 1


class WarmUp:
    """The start's warm-up, on a daemon thread (``start``): ``warm_arrow``, ``warm_lookups``, then ``warm_workers``. A
    failure only costs the speed it would have bought."""

    def __init__(self, catalog: Catalog, storage: LakeStorage, store: Store, spark: Callable[[], SparkSession]) -> None:
        self._catalog, self._storage, self._store, self._spark = catalog, storage, store, spark
        self._task_url = catalog.task_url  # read now: the Spark part may outlive the catalog's connection
        self._stopping = threading.Event()
        self._read_ahead = threading.Event()
        """Set once the thread no longer reads the catalog."""
        self._thread = threading.Thread(target=self._run, name="ducklake-warm-up", daemon=True)

    def start(self) -> WarmUp:
        self._thread.start()
        return self

    def stop(self, session: SparkSession | None) -> None:
        """Stop: wait until the catalog is no longer read (so it may close), and cancel the workers' job, if any, on
        ``session``; a session still starting is left to the daemon thread."""
        self._stopping.set()
        self._read_ahead.wait(timeout=30)
        if session is not None:
            try:
                session.sparkContext.cancelJobGroup(WARM_UP_GROUP)
            except Exception:  # the session is gone already
                log.debug("could not cancel the warm-up job", exc_info=True)

    def _run(self) -> None:
        try:
            try:
                warm_arrow()
                warm_lookups(self._catalog, self._storage, self._store, self._stopping)
            finally:
                self._read_ahead.set()
            if not self._stopping.wait(WORKERS_AFTER_S):
                session = self._spark()
                if not self._stopping.is_set():
                    warm_workers(session, self._task_url)
        except Exception:  # the first batch or task does what is missing itself
            if not self._stopping.is_set():
                log.warning("warming up ahead of the first batch failed; the first batch does it", exc_info=True)
