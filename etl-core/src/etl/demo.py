"""``etl demo``: a throwaway Postgres, sample tables, a pipeline, and what arrived, printed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from etl.config import PipelineConfig
from etl.destination.memory import MemoryDestination
from etl.pipeline import Pipeline
from etl.store.base import TableStateKind
from etl.store.memory import MemoryStore
from etl.testing.compare import source_rows
from etl.testing.postgres import TemporaryCluster, find_install

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

CHANGES = [
    "INSERT INTO customers (id, name, email) VALUES (4, 'Edsger Dijkstra', 'ewd@example.com')",
    "UPDATE customers SET email = 'alan@example.com' WHERE id = 2",
    "DELETE FROM orders WHERE id % 10 = 0",
    "UPDATE orders SET amount = amount * 2 WHERE customer_id = 3",
    "INSERT INTO orders (customer_id, amount, tags, placed) VALUES (4, 12.50, '{new}', '2026-11-21')",
]


def run_demo(rows: int, out: Callable[[str], None]) -> int:
    with TemporaryCluster(find_install()) as cluster:
        out(f"started a throwaway Postgres {cluster.major} on 127.0.0.1:{cluster.port}")
        with cluster.connect() as conn:
            conn.execute(SAMPLE_SCHEMA.replace("%(rows)s", str(int(rows))))
        out(f"created customers (3 rows) and orders ({rows} rows), published as demo_pub")
        config = PipelineConfig.model_validate(
            {"pipeline": {"id": 1, "publication": "demo_pub"}, "source": cluster.connection().model_dump()}
        )
        destination = MemoryDestination()
        pipeline = Pipeline(config, MemoryStore(pipeline_id=1), destination)
        pipeline.start()
        try:
            _wait(pipeline, lambda: _all_ready(pipeline), "initial copy")
            out("initial copy done; streaming changes:")
            with cluster.connect() as conn:
                for sql in CHANGES:
                    conn.execute(sql)
                    out(f"  {sql}")
            _wait(pipeline, lambda: _matches(cluster, destination), "streamed changes")
        finally:
            pipeline.shutdown()
        out("")
        for name in destination.table_names():
            table = destination.rows(name)
            out(f"{name}: {len(table)} rows in the memory destination, equal to the source")
            for row in table[:5]:
                out("  " + ", ".join(f"{k}={_show(v)}" for k, v in row.items()))
            if len(table) > 5:
                out(f"  ... {len(table) - 5} more")
    return 0


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _all_ready(pipeline: Pipeline) -> bool:
    states = pipeline.states
    snapshot = states.snapshot() if states is not None else {}
    return bool(snapshot) and all(s.kind is TableStateKind.READY for s in snapshot.values())


def _matches(cluster: TemporaryCluster, destination: MemoryDestination) -> bool:
    with cluster.connect() as conn:
        try:
            return all(destination.rows(t) == source_rows(conn, t) for t in ("public.customers", "public.orders"))
        except KeyError:  # not arrived yet
            return False


def _wait(pipeline: Pipeline, done: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if pipeline.wait(timeout=0.2):
            raise RuntimeError(f"the pipeline stopped before the {what} finished")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {what} did not finish within {timeout:.0f}s")
