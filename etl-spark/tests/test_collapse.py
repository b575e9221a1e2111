"""The per-key collapse shared by the Spark destinations."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from etl.events import COMMIT_LSN_COLUMN, TX_ORDINAL_COLUMN
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.collapse import (
    ACTION,
    after,
    after_last_truncate,
    last_change_per_key_arrow,
    missing_columns,
)

ITEMS = TableSchema(
    1, TableName("public", "items"), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("label", 25))
)


def test_watermark_and_truncate_cuts(kit: Any) -> None:
    b = kit.BatchBuilder()
    b.commit().insert(ITEMS, {"id": 1, "label": "a"}).insert(ITEMS, {"id": 2, "label": "b"})
    b.commit().truncate(ITEMS).insert(ITEMS, {"id": 3, "label": "c"})
    table = b.build().changes[ITEMS.id][0].table
    first_lsn = table["_etl_commit_lsn"][0].as_py()
    assert after(table, (first_lsn, 0))["id"].to_pylist() == [2, None, 3]  # after the first change (ordinal 0)
    truncated, rest = after_last_truncate(table)
    assert truncated
    assert rest["id"].to_pylist() == [3]
    assert missing_columns(table) == []


def test_after_keeps_exactly_the_changes_past_any_watermark(kit: Any) -> None:
    b = kit.BatchBuilder()
    b.commit().insert(ITEMS, {"id": 1, "label": "a"}).insert(ITEMS, {"id": 2, "label": "b"})
    b.commit().update(ITEMS, {"id": 1, "label": "a2"})
    b.commit().delete(ITEMS, {"id": 2}).insert(ITEMS, {"id": 3, "label": "c"}).insert(ITEMS, {"id": 4, "label": "d"})
    table = b.build().changes[ITEMS.id][0].table
    positions = list(zip(table["_etl_commit_lsn"].to_pylist(), table["_etl_tx_ordinal"].to_pylist(), strict=True))
    lsns = sorted({lsn for lsn, _ in positions})
    watermarks = {(0, 0), (lsns[-1] + 1, 0), *positions}
    watermarks |= {(lsn, -1) for lsn in lsns} | {(lsn - 1, 10**9) for lsn in lsns} | {(lsn, 10**9) for lsn in lsns}
    for watermark in sorted(watermarks):
        expected = [i for i, position in enumerate(positions) if position > watermark]
        kept = after(table, watermark)
        assert kept.to_pylist() == table.take(pa.array(expected, pa.int64())).to_pylist(), watermark


def test_after_is_exact_for_lsns_past_the_precision_of_a_float() -> None:
    high = 2**62  # LSNs this large differ by less than a float64 can tell apart
    changes = pa.table(
        {
            COMMIT_LSN_COLUMN: pa.array([high + 3, high + 3, high + 5], pa.uint64()),
            TX_ORDINAL_COLUMN: pa.array([0, 1, 0], pa.int64()),
        }
    )
    assert after(changes, (high + 3, 0)).to_pylist() == changes.slice(1).to_pylist()
    assert after(changes, (high + 4, 0)).to_pylist() == changes.slice(2).to_pylist()
    assert after(changes, (high + 5, -1)).to_pylist() == changes.slice(2).to_pylist()


def test_last_change_per_key_with_key_change_and_unchanged_toast(kit: Any) -> None:
    b = kit.BatchBuilder()
    b.commit().insert(ITEMS, {"id": 1, "label": "a"}).update(ITEMS, {"id": 1, "label": "a2"})
    b.commit().update(ITEMS, {"id": 10, "label": "moved"}, old={"id": 2}).delete(ITEMS, {"id": 3})
    b.commit().insert(ITEMS, {"id": 3, "label": "again"}).update(ITEMS, {"id": 4, "label": "t"}, missing=("label",))
    b.commit().update(ITEMS, {"id": 1, "label": None}, missing=("label",))
    result = last_change_per_key_arrow(b.build().changes[ITEMS.id][0].table, ["id", "label"], ["id"], ["label"])
    rows = sorted(zip(result["id"].to_pylist(), result[ACTION].to_pylist(), result["label"].to_pylist(), strict=True))
    assert rows == [
        (1, "upsert", "a2"),  # filled from the key's earlier image in the batch
        (2, "delete", None),
        (3, "upsert", "again"),
        (4, "upsert", None),
        (10, "upsert", "moved"),
    ]
    missing = dict(zip(result["id"].to_pylist(), result["_etl_missing"].to_pylist(), strict=True))
    assert missing[4] == ["label"]  # still missing: the destination takes it from its stored row
    assert missing[1] == []


def test_last_change_per_key_in_arrow_with_key_changes(kit: Any) -> None:
    b = kit.BatchBuilder()
    b.commit().insert(ITEMS, {"id": 1, "label": "a"}).update(ITEMS, {"id": 1, "label": "a2"})
    b.commit().update(ITEMS, {"id": 10, "label": "moved"}, old={"id": 2}).delete(ITEMS, {"id": 3})
    b.commit().insert(ITEMS, {"id": 3, "label": "again"}).update(ITEMS, {"id": 11, "label": "x"}, old={"id": 10})
    b.commit().update(ITEMS, {"id": 5, "label": "same key"}, old={"id": 5})
    table = b.build().changes[ITEMS.id][0].table
    result = last_change_per_key_arrow(table, ["id", "label"], ["id"])
    rows = sorted(zip(result["id"].to_pylist(), result[ACTION].to_pylist(), result["label"].to_pylist(), strict=True))
    assert rows == [
        (1, "upsert", "a2"),
        (2, "delete", None),
        (3, "upsert", "again"),
        (5, "upsert", "same key"),
        (10, "delete", None),
        (11, "upsert", "x"),
    ]
    with pytest.raises(ValueError, match="TOAST"):
        b.commit().update(ITEMS, {"id": 4, "label": "t"}, missing=("label",))
        last_change_per_key_arrow(b.build().changes[ITEMS.id][0].table, ["id", "label"], ["id"])


def test_collapse_gives_each_key_its_final_state_on_random_batches(kit: Any) -> None:
    """Random valid histories over a few keys: the collapse gives each touched key its final state."""
    rng = random.Random(7)
    for _ in range(5):
        b, live = kit.BatchBuilder(), {k: f"s{k}" for k in range(6)}  # rows stored before the batch
        for _ in range(40):
            b.commit()
            for _ in range(rng.randint(1, 4)):
                key = rng.randrange(12)
                if key in live and rng.random() < 0.3:
                    b.delete(ITEMS, {"id": key})
                    del live[key]
                elif key in live and rng.random() < 0.5:
                    new = rng.randrange(12)
                    if new != key and new in live:
                        continue
                    live[new] = f"l{rng.random():.3f}"
                    if new != key:
                        del live[key]
                    b.update(ITEMS, {"id": new, "label": live[new]}, old={"id": key})
                elif key not in live:
                    live[key] = f"i{rng.random():.3f}"
                    b.insert(ITEMS, {"id": key, "label": live[key]})
        table = b.build().changes[ITEMS.id][0].table
        collapsed = last_change_per_key_arrow(table, ["id", "label"], ["id"])
        touched = {*table["id"].to_pylist(), *(o["id"] for o in table["_etl_old"].to_pylist() if o is not None)}
        expected = {k: ("upsert", live[k]) if k in live else ("delete", None) for k in touched}
        assert _by_key(collapsed) == expected


def _by_key(result: pa.Table) -> dict[int, tuple[str, str | None]]:
    return {
        k: (a, label if a == "upsert" else None)
        for k, a, label in zip(
            result["id"].to_pylist(), result[ACTION].to_pylist(), result["label"].to_pylist(), strict=True
        )
    }


DOCS = TableSchema(
    2,
    TableName("public", "docs"),
    (ColumnSchema("id", 23, primary_key=True), ColumnSchema("n", 23), ColumnSchema("body", 25)),
)


def test_collapse_fills_unchanged_toast_through_moved_keys_on_random_batches(kit: Any) -> None:
    """Random valid histories with unchanged TOAST values (``body`` missing from updates, keys moving too): the
    collapse fills a key's missing value from its earlier images in the batch, through the keys it moved from (a
    row inserted, then moved, holds the inserted value), and names the stored row the rest stems from
    (``PRIOR_KEY``): a row moved, then updated again, still stems from the row it moved from."""
    rng, stems = random.Random(11), 0
    for _ in range(60):
        b = kit.BatchBuilder()
        live: dict[int, tuple[str | None, int]] = {k: (None, k) for k in range(6)}  # body (None: stored), stem
        for _ in range(rng.randint(3, 12)):  # short: keys keep missing values to the end
            b.commit()
            for _ in range(rng.randint(1, 3)):
                key = rng.randrange(12)
                if key in live and rng.random() < 0.25:
                    b.delete(DOCS, {"id": key})
                    del live[key]
                elif key in live:
                    new = key if rng.random() < 0.6 else rng.randrange(12)
                    if new != key and new in live:
                        continue
                    unchanged = rng.random() < 0.7
                    state = live.pop(key)
                    live[new] = state = state if unchanged else (f"b{rng.random():.3f}", new)
                    old = {"id": key} if new != key else None
                    row = {"id": new, "n": rng.randrange(100), "body": None if unchanged else state[0]}
                    b.update(DOCS, row, old=old, missing=("body",) if unchanged else ())
                else:
                    live[key] = (f"i{rng.random():.3f}", key)
                    b.insert(DOCS, {"id": key, "n": 0, "body": live[key][0]})
        table = b.build().changes[DOCS.id][0].table
        names = ["id", "n", "body"]
        collapsed = last_change_per_key_arrow(table, names, ["id"], ["body"])
        touched = {*table["id"].to_pylist(), *(o["id"] for o in table["_etl_old"].to_pylist() if o is not None)}
        expected: dict[int, tuple[str, str | None, int | None]] = {}
        for k in touched:
            if k not in live:
                expected[k] = ("delete", None, None)
            elif live[k][0] is None:
                expected[k] = ("upsert", None, live[k][1])  # still missing: from the stored row of its stem
            else:
                expected[k] = ("upsert", live[k][0], None)
        assert _toast_by_key(collapsed) == expected
        stems += sum(1 for k, (action, _, stem) in expected.items() if action == "upsert" and stem not in (None, k))
    assert stems >= 5, "too few keys moved in with values still missing: the histories test too little"


def _toast_by_key(result: pa.Table) -> dict[int, tuple[str, str | None, int | None]]:
    out: dict[int, tuple[str, str | None, int | None]] = {}
    for row in result.select(["id", ACTION, "body", "_etl_missing", "_etl_prior_key"]).to_pylist():
        if row[ACTION] == "delete":
            out[row["id"]] = ("delete", None, None)
        elif row["_etl_missing"]:
            out[row["id"]] = ("upsert", None, row["_etl_prior_key"]["id"])
        else:
            out[row["id"]] = ("upsert", row["body"], None)
    return out
