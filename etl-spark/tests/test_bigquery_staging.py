"""How a write's frames share staging tables (``etl_spark.bigquery.staging``); loading them is tested against the
emulator in test_bigquery_destination.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from etl_spark.bigquery.staging import Part, groups, source, table_prefix


def frame(width: int) -> Any:
    """Stands in for a Spark DataFrame: ``groups`` reads only its columns."""
    return SimpleNamespace(columns=[f"c{i}" for i in range(width)])


def test_frames_share_one_staging_table_until_the_column_limit() -> None:
    frames = [frame(4), frame(3), frame(2), frame(6), frame(1)]
    assert [[len(f.columns) for f in run] for run in groups(frames, max_columns=9)] == [[4, 3, 2], [6, 1]]
    assert len(groups(frames)) == 1  # BigQuery's 10,000 columns: one load for all
    assert [[len(f.columns) for f in run] for run in groups([frame(12)], max_columns=9)] == [[12]]  # alone, as is


def test_a_part_reads_back_under_its_own_names() -> None:
    part = Part(3, ("id", "_etl_action"))
    assert (
        source("`p.d.s`", part)
        == "(SELECT `_etl_p3_0` AS `id`, `_etl_p3_1` AS `_etl_action` FROM `p.d.s` WHERE _etl_part = 3)"
    )


def test_staging_table_names_tell_pipelines_apart() -> None:
    assert table_prefix(1) == "_etl_staging_1_"
    assert not table_prefix(12).startswith(table_prefix(1))
