"""Planning reads the catalog state of all of a batch's tables at once (``table_state.read_states``): as many
statements for many tables as for one, and for each table what is in the lake, DuckDB and the files agreeing."""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa

from etl.lsn import Lsn
from etl.schema import ColumnSchema, TableName, TableSchema
from etl_spark.ducklake.catalog import engine_for, inlined
from etl_spark.ducklake.table_state import read_states


def schema(index: int) -> TableSchema:
    return TableSchema(
        17000 + index,
        TableName("public", f"t{index}"),
        (ColumnSchema("id", 20, nullable=False, primary_key=True, attnum=1), ColumnSchema("note", 25, attnum=2)),
    )


TABLES = [schema(i) for i in range(6)]


def statements(engine: sa.Engine, read: Any) -> int:
    count = [0]

    def counted(*_: Any) -> None:
        count[0] += 1

    sa.event.listen(engine, "before_cursor_execute", counted)
    try:
        read()
    finally:
        sa.event.remove(engine, "before_cursor_execute", counted)
    return count[0]


def test_many_tables_are_read_in_as_many_statements_as_one(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    for index, table in enumerate(TABLES):
        destination.write_table_rows(table, kit.rows_table(table, [{"id": index, "note": "n"}]))
    destination.write_events(kit.BatchBuilder().commit().insert(TABLES[0], {"id": 100, "note": "i"}).build())
    catalog = destination.catalog  # t0 has a data file and inlined rows, the others a data file
    one = statements(catalog.engine, lambda: read_states(catalog, TABLES[:1]))
    assert statements(catalog.engine, lambda: read_states(catalog, TABLES)) == one


def test_each_table_reads_as_it_stands_in_the_lake(lake: Any, kit: Any) -> None:
    destination = kit.make_destination(lake)
    copied, inlined, dropped, new = TABLES[:4]
    for table in (copied, inlined, dropped):
        destination.write_table_rows(table, kit.rows_table(table, [{"id": i, "note": "n"} for i in range(3, 9)]))
        destination.write_table_rows(table, kit.rows_table(table, [{"id": i, "note": "n"} for i in range(20, 25)]))
    destination.write_events(kit.BatchBuilder().commit().insert(inlined, {"id": 100, "note": "i"}).build())
    lake.query("DROP TABLE lake.public.t2")

    states = read_states(destination.catalog, [copied, inlined, dropped, new])

    assert states[new.id].handle is None and not states[new.id].tracked
    assert states[dropped.id].handle is None and states[dropped.id].tracked
    assert not states[copied.id].inlined_tables
    assert len(states[inlined.id].inlined_tables) == 1
    for table in (copied, inlined):
        state = states[table.id]
        assert state.handle is not None and state.handle.table.name == table.name.name
        assert [c.name for c in state.handle.table.columns] == ["id", "note"]
        assert state.max_column_id == 2
        name = table.name.name
        listed = lake.query(f"SELECT data_file FROM ducklake_list_files('lake', '{name}', schema => 'public')")
        assert sorted(f.path for f in state.data_files) == sorted(path for (path,) in listed)
        bounds = {}
        for file in state.data_files:
            low_high = pc.min_max(pq.read_table(file.path, columns=["id"])["id"])
            bounds[file.data_file_id] = (low_high["min"].as_py(), low_high["max"].as_py())
        assert state.key_bounds == bounds
        assert sorted(bounds.values()) == [(3, 8), (20, 24)]


def test_a_key_named_like_a_dropped_column_finds_its_stored_rows(lake: Any, kit: Any) -> None:
    """The source dropped its key column ``id`` and made ``other``, renamed ``id``, the key; a batch updates a copied
    row under the new key. The bounds of the old ``id`` column (1 to 5) must not rule out the file holding 103."""
    id_, other, note = (
        ColumnSchema("id", 20, nullable=False, primary_key=True, attnum=1),
        ColumnSchema("other", 20, nullable=False, attnum=2),
        ColumnSchema("note", 25, attnum=3),
    )
    first = TableSchema(17100, TableName("public", "swap"), (id_, other, note))
    destination = kit.make_destination(lake, inline_row_limit=0)
    copied = [{"id": i, "other": 100 + i, "note": "n"} for i in range(1, 6)]
    destination.write_table_rows(first, kit.rows_table(first, copied))
    builder = kit.BatchBuilder().commit()
    renamed = ColumnSchema("id", 20, nullable=False, primary_key=True, attnum=2)
    second = TableSchema(first.id, first.name, (renamed, note), snapshot_lsn=Lsn(builder.lsn))
    destination.write_events(builder.update(second, {"id": 103, "note": "x"}).build())
    assert lake.query("SELECT id, note FROM lake.public.swap ORDER BY id, note") == [
        (101, "n"),
        (102, "n"),
        (103, "x"),
        (104, "n"),
        (105, "n"),
    ]


def test_inlined_tables_holding_rows_are_found_among_hundreds(lake: Any) -> None:
    """More tables than SQLite takes terms in one compound SELECT (500): probed in several statements."""
    engine = engine_for(lake.url)
    names = [f"ducklake_inlined_data_{i}_1" for i in range(501)]
    with engine.begin() as conn:
        for i, name in enumerate(names):
            conn.execute(sa.text(f'CREATE TABLE "{name}" (row_id BIGINT)'))
            if i % 7 == 0:
                conn.execute(sa.text(f'INSERT INTO "{name}" VALUES (1)'))
    with engine.connect() as conn:
        assert inlined.holding_rows(conn, names) == {n for i, n in enumerate(names) if i % 7 == 0}
        assert inlined.holding_rows(conn, []) == set()
    engine.dispose()
