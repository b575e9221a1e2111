"""BigQuery table ids: readable, free of collisions, and refused when they could not be."""

from __future__ import annotations

import itertools

import pytest

from etl.errors import TableError
from etl.schema import TableName
from etl_spark.bigquery.names import table_id


def test_table_ids_are_readable_and_distinct() -> None:
    assert table_id(TableName("public", "orders")) == "public_orders"
    assert table_id(TableName("my_app", "order_items")) == "my__app_order__items"
    parts = ["a", "a_b", "b", "a__b", "b_c", "a_b_c"]
    names = [TableName(s, t) for s, t in itertools.product(parts, parts)]
    assert len({table_id(n) for n in names}) == len(names)


@pytest.mark.parametrize("bad", ["_lead", "trail_", "has-dash", "sp ace", "ünï"])
def test_names_that_could_collide_are_refused(bad: str) -> None:
    with pytest.raises(TableError, match="cannot be part of a BigQuery table id"):
        table_id(TableName("public", bad))
