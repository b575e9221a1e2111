"""History mode end to end: a copy, then a workload killed mid-batch by SIGKILL of ``etl run`` and restarted.

An audit trigger at the source records every change the workload makes (a key change as a delete of the
old key and an update of the new one, as the destination records it). Afterwards BigQuery's history table
must hold the copied rows plus exactly those changes: the same count, the same rows, each key's changes in
the order they committed. The kill lands while a batch is staged, before its transaction; a replay of a
batch whose transaction committed before its answer was lost is tested in
etl-spark/tests/test_bigquery_faults.py, a replay of a whole applied batch in test_bigquery_destination.py.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from google.api_core import exceptions

from etl.schema import TableName
from etl.testing.pipelines import pipeline_config
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config
from etl.testing.workload import churn, concurrent_transactions, create_items_and_ledger
from etl_spark.bigquery.names import table_id
from etl_spark.testing.bigquery_emulator import PROJECT, BigQueryEmulator

pytestmark = pytest.mark.slow  # see docs/testing.md

AUDIT = """
CREATE TABLE audit (seq bigserial PRIMARY KEY, op text, id bigint, qty int);
CREATE FUNCTION audit_items() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        INSERT INTO audit (op) VALUES ('truncate');
    ELSIF TG_OP = 'INSERT' THEN
        INSERT INTO audit (op, id, qty) VALUES ('insert', NEW.id, NEW.qty);
    ELSIF TG_OP = 'UPDATE' THEN
        IF NEW.id <> OLD.id THEN
            INSERT INTO audit (op, id) VALUES ('delete', OLD.id);
        END IF;
        INSERT INTO audit (op, id, qty) VALUES ('update', NEW.id, NEW.qty);
    ELSE
        INSERT INTO audit (op, id) VALUES ('delete', OLD.id);  -- a delete carries the old key only
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER audit_rows AFTER INSERT OR UPDATE OR DELETE ON items FOR EACH ROW EXECUTE FUNCTION audit_items();
CREATE TRIGGER audit_truncate AFTER TRUNCATE ON items FOR EACH STATEMENT EXECUTE FUNCTION audit_items();
"""

Change = tuple[str, Any, Any]
"""``(op, id, qty)``"""


def transaction(conn: psycopg.Connection[Any], i: int) -> None:
    """``churn`` (updates, a key change) plus an insert and a delete of ``items``."""
    churn(conn, i, key_updates=True)
    conn.execute("INSERT INTO items (id, name, qty) VALUES (%s, 'new', %s)", (i + 500000, i))
    conn.execute("DELETE FROM items WHERE id = %s", (i + 2000,))


@pytest.mark.first_major
def test_history_rows_are_the_source_changes_after_a_sigkill_mid_batch(
    pg_database: TestDatabase, bigquery_emulator: BigQueryEmulator, tmp_path: Path
) -> None:
    db, emulator = pg_database, bigquery_emulator
    create_items_and_ledger(db, items=3000, ledger=10)
    copied = Counter(("copy", r[0], r[1]) for r in db.execute("SELECT id, qty FROM items"))
    db.execute(AUDIT)
    db.execute("CREATE PUBLICATION pub FOR TABLE items")
    dataset = f"history_pg{db.major}"
    bucket = emulator.bucket_dir("staging")
    config = pipeline_config(
        db,
        pipeline_id=11,
        batch={"max_fill_ms": 300},
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={
            "type": "bigquery",
            "mode": "history",
            "min_apply_interval_s": 1,
            "project": PROJECT,
            "dataset": dataset,
            "staging_uri": f"gs://staging/{dataset}",
            "staging_local_dir": str(bucket),
            "endpoint": emulator.endpoint,
            "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "2"}},
        },
    )
    ref = f"`{PROJECT}.{dataset}.{table_id(TableName('public', 'items'))}`"

    def history() -> list[dict[str, Any]]:
        client = emulator.client()
        try:
            rows = client.query_and_wait(
                f"SELECT _etl_op, id, qty FROM {ref} ORDER BY id, _etl_commit_lsn NULLS FIRST, _etl_tx_ordinal"
            )
            return [dict(r.items()) for r in rows]
        finally:
            client.close()  # type: ignore[no-untyped-call]

    def changes() -> list[Change]:
        return [(r[0], r[1], r[2]) for r in db.execute("SELECT op, id, qty FROM audit ORDER BY seq")]

    def expected() -> Counter[Change]:
        return copied + Counter(changes())

    def stored() -> Counter[Change]:
        return Counter((r["_etl_op"], r["id"], r["qty"]) for r in history())

    run = PipelineProcess(write_config(tmp_path / "pipeline.toml", config))
    try:
        run.start()
        not_yet = (exceptions.NotFound, exceptions.BadRequest)
        run.wait_equal(expected, stored, not_yet=not_yet)
        with concurrent_transactions(db, transaction, count=150):
            time.sleep(0.5)
            run.kill_mid_write(lambda: set((bucket / dataset).glob("*")))  # a write's directory, gone once loaded
            run.start()
        db.execute("TRUNCATE items")
        db.execute("INSERT INTO items (id, name, qty) VALUES (1, 'again', 7)")
        run.wait_equal(expected, stored, not_yet=not_yet)
    finally:
        run.stop(timeout=120)

    made = changes()
    assert len(made) >= 150 * 4  # the workload's changes: every one is in the history once
    assert sum(stored().values()) == sum(copied.values()) + len(made)
    per_key: dict[Any, list[str]] = {}
    for op, key, _ in made:
        per_key.setdefault(key, []).append(op)
    recorded: dict[Any, list[str]] = {}
    for row in history():
        if row["_etl_op"] != "copy":
            recorded.setdefault(row["id"], []).append(row["_etl_op"])
    assert recorded == per_key  # each key's changes in commit order (the truncate has no key: None)
