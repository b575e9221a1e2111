"""What a start does ahead, on a thread of its own, so that the first batch does not: Arrow's first use, and the
key lookups.

The first Parquet write of a process, its first grouping (Acero's thread pool) and first compute kernels cost a
tenth of a second or more, once; ``warm_arrow`` spends it on a row of nothing.

A batch's updates and deletes find their stored rows by reading the key column of each candidate data file and
its delete file's positions (``storage.LakeStorage.positions_of_keys``), kept in the lookup cache from then on.
After a start the cache is empty, and the first batch would read them all inside its write (a tenth of a second
per million rows here, more from object storage). So they are read at the start, while the stream begins, for
the tables the store says are copied, as far as the cache holds them.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import structlog

from etl.api import Store
from etl_spark.ducklake.catalog import Catalog
from etl_spark.ducklake.plan import searchable
from etl_spark.ducklake.storage import LakeStorage

log = structlog.get_logger(__name__)


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


def start_warming(catalog: Catalog, storage: LakeStorage, store: Store, stop: threading.Event) -> threading.Thread:
    """``warm_arrow`` and ``warm_lookups`` on a daemon thread; a failure only costs the speed it would have bought."""

    def run() -> None:
        try:
            warm_arrow()
            warm_lookups(catalog, storage, store, stop)
        except Exception:  # the first batch reads what is missing itself
            log.warning("reading the key lookups ahead failed; the first batch reads them", exc_info=True)

    thread = threading.Thread(target=run, name="ducklake-warm-up", daemon=True)
    thread.start()
    return thread
