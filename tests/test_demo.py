"""``etl demo``: a throwaway Postgres into a local DuckLake lake with the SQLite store, or into memory."""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

from etl.demo import run_demo
from etl.plugins import load_registry
from etl_spark.ducklake.reader import open_lake


def test_demo_streams_into_ducklake_and_prints_what_duckdb_reads(tmp_path: Path) -> None:
    lines: list[str] = []
    assert run_demo(rows=50, out=lines.append, directory=tmp_path / "demo") == 0
    text = "\n".join(lines)
    assert f"a DuckLake lake in {tmp_path / 'demo' / 'lake'}" in text and "store:       SQLite" in text
    copied, streamed = text.split("after the streamed changes")
    assert "public.customers: 3 rows as DuckDB 1.5.5 reads them (same as the source's 3)" in copied
    assert "public.orders: 50 rows as DuckDB 1.5.5 reads them (same as the source's 50)" in copied
    # 5 orders deleted (id % 10 = 0), one inserted; a customer inserted; a column added and filled.
    assert "public.customers: 4 rows as DuckDB 1.5.5 reads them (same as the source's 4)" in streamed
    assert "public.orders: 46 rows as DuckDB 1.5.5 reads them (same as the source's 46)" in streamed
    assert "id=1, name='Ada Lovelace', email='ada@example.com'" in streamed and "tier='gold'" in streamed

    con = open_lake(f"sqlite:///{tmp_path / 'demo' / 'lake' / 'catalog.sqlite'}")  # the lake stays
    try:
        assert con.execute("SELECT count(*) FROM lake.public.orders").fetchall() == [(46,)]
    finally:
        con.close()


def test_demo_without_the_plugins_uses_memory_and_says_so() -> None:
    core_only = load_registry([ep for ep in md.entry_points(group="etl") if ep.name == "core"])
    lines: list[str] = []
    assert run_demo(rows=20, out=lines.append, registry=core_only) == 0
    text = "\n".join(lines)
    assert "destination: memory, store: memory" in text and "etl-spark" in text
    assert "public.orders: 19 rows as the memory destination reads them (same as the source's 19)" in text
