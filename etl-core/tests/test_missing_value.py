"""The value rows older than a column hold (``ColumnSchema.missing_value``): what the DDL trigger and the catalog
read of ``pg_attribute.attmissingval``, and how stores keep it."""

from __future__ import annotations

import json

from etl.postgres import pgoutput as pg
from etl.postgres.catalog import table_schema
from etl.postgres.ddl import MESSAGE_PREFIX, install_ddl_trigger, parse_schema_change
from etl.schema import ColumnSchema, TableName, TableSchema
from etl.store.codec import schema_from_json, schema_from_obj, schema_to_json, schema_to_obj
from etl.testing.pytest_plugin import TestDatabase

ADDED = {  # column definition -> the text form existing rows hold (None: Postgres rewrote the rows, or NULL)
    "c int NOT NULL DEFAULT 0": "0",
    "s text DEFAULT 'x, \"y\"'": 'x, "y"',
    "q text DEFAULT E'a\\\\b\"{}'": 'a\\b"{}',
    "nl text DEFAULT 'NULL'": "NULL",
    "es text DEFAULT ''": "",
    "w text[] DEFAULT ARRAY['a,b', NULL, 'NULL']": '{"a,b",NULL,"NULL"}',
    "e int[] DEFAULT '{}'": "{}",
    "z timestamptz DEFAULT '2024-05-06 07:08:09.5+02'": "2024-05-06 05:08:09.5+00",
    "d date DEFAULT '2024-05-06'": "2024-05-06",
    "f float8 DEFAULT 0.1": "0.1",
    "n text DEFAULT NULL": None,
    "plain int": None,
}


def test_the_trigger_and_the_catalog_give_the_value_older_rows_hold(pg_database: TestDatabase) -> None:
    pg_database.execute(
        "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1); CREATE PUBLICATION pub FOR TABLE t"
    )
    with pg_database.connect() as conn:
        assert install_ddl_trigger(conn)
    pg_database.execute("SELECT pg_create_logical_replication_slot('missing', 'pgoutput')")
    with pg_database.connect() as conn:  # a session whose settings would print values otherwise
        conn.execute("SET DateStyle = 'SQL, DMY'; SET TimeZone = 'Asia/Tokyo'; SET extra_float_digits = 0")
        conn.execute("ALTER TABLE t " + ", ".join(f"ADD COLUMN {definition}" for definition in ADDED))
        conn.execute("ALTER TABLE t ADD COLUMN v float8 DEFAULT random()")  # volatile: every row rewritten
    rows = pg_database.execute(
        "SELECT data FROM pg_logical_slot_get_binary_changes('missing', NULL, NULL, 'proto_version', '1',"
        " 'publication_names', 'pub', 'messages', 'true')"
    )
    decoder = pg.PgOutputDecoder(1)
    messages = [decoder.decode(bytes(row[0])) for row in rows]
    first, second = (
        parse_schema_change(m.content)
        for m in messages
        if isinstance(m, pg.LogicalMessage) and m.prefix == MESSAGE_PREFIX
    )
    expected = {"id": None, **{d.split()[0]: value for d, value in ADDED.items()}}
    assert {c.column.name: c.column.missing_value for c in first.columns} == expected
    # The rewrite by the volatile default made the rows hold every value: none is missing any more.
    assert {c.column.missing_value for c in second.columns} == {None}
    assert not any(isinstance(m, (pg.Insert, pg.Update)) for m in messages)  # and it sent none of them
    with pg_database.connect() as conn:
        schema = table_schema(conn, first.table_id)
    assert {c.name: c.missing_value for c in schema.columns} == {**dict.fromkeys(expected), "v": None}


def test_a_message_of_an_earlier_trigger_has_no_missing_value() -> None:
    column = {
        "attnum": 1, "name": "c", "type_oid": 23, "type_modifier": -1, "type_name": "integer",
        "not_null": True, "default": "0", "generated": "", "key": False,
    }  # fmt: skip
    doc = {"v": 1, "server_version_num": 150000, "oid": 7, "schema": "s", "name": "t", "replica_identity": "d",
           "publications": {"p": ["c"]}, "columns": [column]}  # fmt: skip
    (old,) = parse_schema_change(json.dumps(doc).encode()).columns
    (new,) = parse_schema_change(json.dumps({**doc, "columns": [{**column, "missing": "0"}]}).encode()).columns
    assert (old.column.missing_value, new.column.missing_value) == (None, "0")


def test_stores_keep_the_missing_value_and_read_schemas_stored_without_it() -> None:
    schema = TableSchema(7, TableName("s", "t"), (ColumnSchema("c", 23, default="0", missing_value="0"),))
    assert schema_from_json(schema_to_json(schema)) == schema
    stored = schema_to_obj(schema)
    del stored["columns"][0]["missing_value"]  # what an earlier version stored
    assert schema_from_obj(stored).columns[0].missing_value is None
