"""``etl demo``: a throwaway Postgres, sample tables, a pipeline, and the tables as the destination reads them.

With the ``ducklake`` destination (etl-spark) and the ``sqlite`` store (etl-store-sqlite) installed,
the pipeline writes a local DuckLake lake and keeps its state in SQLite, and the tables are printed
as DuckDB reads them; otherwise it uses the memory destination and store, and says so. Plugins are
found and built through the registry, as ``etl run`` does, so etl-core imports no plugin.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from etl.config import PipelineConfig
from etl.demo_postgres import ThrowawayCluster, find_install
from etl.destination.base import Destination, PreviewableDestination
from etl.errors import ConfigError
from etl.factory import build_destination, build_store
from etl.lsn import Lsn
from etl.pipeline import Pipeline
from etl.plugins import Registry, load_registry
from etl.schema import TableName
from etl.store.base import APPLY_WORKER, TableStateKind

SAMPLE_SCHEMA = """
CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text, created timestamptz DEFAULT now());
CREATE TABLE orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id int REFERENCES customers,
    amount numeric(12, 2),
    tags text[],
    placed date
);
INSERT INTO customers (id, name, email) VALUES
    (1, 'Ada Lovelace', 'ada@example.com'), (2, 'Alan Turing', NULL), (3, 'Grace Hopper', 'grace@example.com');
INSERT INTO orders (customer_id, amount, tags, placed)
SELECT 1 + g % 3, (g * 7 % 1000) / 10.0, ARRAY['demo', 'batch-' || g % 4], DATE '2026-01-01' + g % 300
FROM generate_series(1, %(rows)s) g;
CREATE PUBLICATION demo_pub FOR TABLE customers, orders;
"""

TABLES = (TableName("public", "customers"), TableName("public", "orders"))

CHANGES = [
    "INSERT INTO customers (id, name, email) VALUES (4, 'Edsger Dijkstra', 'ewd@example.com')",
    "UPDATE customers SET email = 'alan@example.com' WHERE id = 2",
    "ALTER TABLE customers ADD COLUMN tier text",
    "UPDATE customers SET tier = 'gold' WHERE id IN (1, 3)",
    "DELETE FROM orders WHERE id % 10 = 0",
    "UPDATE orders SET amount = amount * 2 WHERE customer_id = 3",
    "INSERT INTO orders (customer_id, amount, tags, placed) VALUES (4, 12.50, '{new}', '2026-11-21')",
]

PREVIEW_ROWS = 5


def run_demo(
    rows: int, out: Callable[[str], None], directory: Path | None = None, registry: Registry | None = None
) -> int:
    """Run the demo, writing its report through ``out``; ``directory`` keeps the lake and the store."""
    registry = registry or load_registry()
    started = time.monotonic()
    with ThrowawayCluster(find_install()) as cluster, _workdir(directory) as work:
        out(f"started a throwaway Postgres {cluster.major} on 127.0.0.1:{cluster.port}")
        with cluster.connect() as conn:
            conn.execute(SAMPLE_SCHEMA.replace("%(rows)s", str(int(rows))))
        out(f"created customers (3 rows) and orders ({rows} rows), published as demo_pub")
        config = demo_config(cluster, registry, work)
        describe(config, work, out)
        store = build_store(config, "etl demo", registry)
        destination = build_destination(config, store, "etl demo", registry)
        pipeline = Pipeline(config, store, destination)
        pipeline.start()
        try:
            _wait(pipeline, lambda: _all_ready(pipeline), "initial copy")
            out(f"\ninitial copy done ({time.monotonic() - started:.0f} s since the start):")
            show(destination, cluster, out)
            out("\nstreaming changes:")
            changed = time.monotonic()
            marker = _run_changes(cluster, out)
            _wait(pipeline, lambda: (pipeline.store.get_progress(APPLY_WORKER) or 0) > marker, "streamed changes")
            out(f"\nafter the streamed changes (durable {time.monotonic() - changed:.1f} s after the first one):")
            show(destination, cluster, out)
        finally:
            pipeline.shutdown()
        if directory is not None and config.destination.type == "ducklake":
            out(f"\nthe lake stays in {work}; open it with DuckDB 1.5 and its ducklake extension:")
            out(f"  ATTACH 'ducklake:sqlite:{work / 'lake' / 'catalog.sqlite'}' AS lake; FROM lake.public.orders;")
    return 0


def demo_config(cluster: ThrowawayCluster, registry: Registry, work: Path) -> PipelineConfig:
    """DuckLake with the SQLite store when both plugins are installed, else the memory destination and store."""
    raw: dict[str, Any] = {
        "pipeline": {"id": 1, "publication": "demo_pub"},
        "source": cluster.connection().model_dump(),
        "batch": {"max_fill_ms": 500},
    }
    if _installed(registry, "destination", "ducklake") and _installed(registry, "store", "sqlite"):
        lake = work / "lake"
        raw["store"] = {"type": "sqlite", "path": str(work / "state.sqlite")}
        raw["destination"] = {
            "type": "ducklake",
            "catalog": f"sqlite:///{lake / 'catalog.sqlite'}",
            "data_path": f"{lake / 'data'}/",
            "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        }
    return PipelineConfig.model_validate(raw)


def describe(config: PipelineConfig, work: Path, out: Callable[[str], None]) -> None:
    if config.destination.type == "ducklake":
        out(f"destination: a DuckLake lake in {work / 'lake'} (catalog in SQLite, Parquet written by Spark)")
        out(f"store:       SQLite, {work / 'state.sqlite'}")
        out("(the first write starts Spark, which takes a few seconds)")
    else:
        out("destination: memory, store: memory (for a DuckLake lake with a SQLite store, install etl-spark[duckdb]")
        out("             and etl-store-sqlite; `./dev demo` does)")


def show(destination: Destination, cluster: ThrowawayCluster, out: Callable[[str], None]) -> None:
    """Each table as the destination's own reader returns it: count (beside the source's) and first rows."""
    if not isinstance(destination, PreviewableDestination):
        out(f"  (the {destination.name} destination cannot read its tables back)")
        return
    for table in TABLES:
        preview = destination.preview(table, PREVIEW_ROWS)
        with cluster.connect() as conn:
            count = conn.execute(f"SELECT count(*) FROM {table.quoted()}").fetchone()
        source = int(count[0]) if count else 0
        same = "same as" if preview.total == source else "NOT the same as"
        out(f"{table}: {preview.total} rows as {preview.reader} reads them ({same} the source's {source})")
        for row in preview.rows:
            out("  " + ", ".join(f"{k}={_show(v)}" for k, v in row.items()))
        if preview.total > len(preview.rows):
            out(f"  ... {preview.total - len(preview.rows)} more")


def _run_changes(cluster: ThrowawayCluster, out: Callable[[str], None]) -> Lsn:
    """Run ``CHANGES``; return a WAL position inside the last one's transaction, before its commit."""
    marker = Lsn.ZERO
    with cluster.connect() as conn:
        for sql in CHANGES:
            with conn.transaction():
                row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
                marker = Lsn.parse(row[0]) if row else marker
                conn.execute(sql)
            out(f"  {sql}")
    return marker


@contextlib.contextmanager
def _workdir(directory: Path | None) -> Iterator[Path]:
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        yield directory.resolve()
        return
    with tempfile.TemporaryDirectory(prefix="etl-demo-") as temporary:
        yield Path(temporary)


def _installed(registry: Registry, kind: str, name: str) -> bool:
    try:
        registry.destination(name) if kind == "destination" else registry.store(name)
    except ConfigError:
        return False
    return True


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _all_ready(pipeline: Pipeline) -> bool:
    states = pipeline.states
    snapshot = states.snapshot() if states is not None else {}
    return bool(snapshot) and all(s.kind is TableStateKind.READY for s in snapshot.values())


def _wait(pipeline: Pipeline, done: Callable[[], bool], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if pipeline.wait(timeout=0.2):
            raise RuntimeError(f"the pipeline stopped before the {what} finished")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {what} did not finish within {timeout:.0f}s")
