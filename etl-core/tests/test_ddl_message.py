"""parse_schema_change on hostile content (sans-IO): whatever a message holds, the parser raises ``SourceError``
and nothing else, so that a recorded message it cannot read never stops a pipeline."""

from __future__ import annotations

import json
from typing import Any

import pytest

from etl.errors import SourceError
from etl.lsn import Lsn
from etl.postgres.ddl import MAX_MESSAGE_BYTES, parse_schema_change

COLUMN: dict[str, Any] = {
    "attnum": 1, "name": "id", "type_oid": 23, "type_modifier": -1, "type_name": "integer",
    "not_null": True, "default": None, "generated": "", "key": True,
}  # fmt: skip


def message(**overrides: Any) -> bytes:
    doc: dict[str, Any] = {
        "v": 1,
        "server_version_num": 150000,
        "oid": 16384,
        "schema": "public",
        "name": "t",
        "replica_identity": "d",
        "publications": {"pub": ["id"]},
        "columns": [COLUMN],
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


def column(**overrides: Any) -> bytes:
    return message(columns=[{**COLUMN, **overrides}])


def test_a_genuine_message_parses() -> None:
    change = parse_schema_change(message())
    assert (change.table_id, str(change.name), [c.column.name for c in change.columns]) == (16384, "public.t", ["id"])


GENERATED: dict[str, Any] = {**COLUMN, "attnum": 3, "name": "gen", "not_null": False, "generated": "s", "key": False}


def test_parse_keeps_stored_generated_columns_a_postgres_18_publication_lists() -> None:
    columns, publications = [COLUMN, GENERATED], {"p": ["id", "gen"], "q": None}
    change = parse_schema_change(message(server_version_num=180000, columns=columns, publications=publications))
    listed = change.table_schema("p", Lsn.ZERO)
    all_plain = change.table_schema("q", Lsn.ZERO)  # before Postgres 15: no column names, all plain columns
    assert listed is not None and listed.column_names == ["id", "gen"]
    assert all_plain is not None and all_plain.column_names == ["id"]
    older = parse_schema_change(message(server_version_num=170000, columns=columns, publications=publications))
    assert (older_schema := older.table_schema("p", Lsn.ZERO)) is not None and older_schema.column_names == ["id"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (message(v=2), "format 2"),
        (b"not json", "malformed"),
        (b"[1, 2]", "malformed"),
        (message(columns=[{"name": "x"}]), "malformed"),
        (message(replica_identity="z"), "malformed"),
    ],
)
def test_parse_says_what_it_cannot_read(content: bytes, expected: str) -> None:
    with pytest.raises(SourceError) as caught:
        parse_schema_change(content)
    assert expected in caught.value.message
    assert caught.value.hint is not None and "reinstall" in caught.value.hint


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"[" * 100_000, id="deep nesting, unterminated"),
        pytest.param(message(columns=json.loads("[" * 900 + "]" * 900)), id="deep nesting in valid JSON"),
        pytest.param(b'{"v": 1, "columns": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", id="deeper than the stack"),
        pytest.param(message().replace(b'"oid": 16384', b'"oid": 1e999'), id="1e999"),
        pytest.param(message().replace(b'"oid": 16384', b'"oid": ' + b"9" * 5000), id="a 5000-digit number"),
        pytest.param(message(oid=2**70), id="oid out of range"),
        pytest.param(message(oid=1.5), id="oid a float"),
        pytest.param(message(oid=True), id="oid a boolean"),
        pytest.param(message(name={"x": 1}), id="name an object"),
        pytest.param(message(schema=None), id="schema null"),
        pytest.param(message(columns="id"), id="columns a string"),
        pytest.param(message(columns=[1]), id="a column a number"),
        pytest.param(message(columns=None), id="columns null"),
        pytest.param(message(publications=["pub"]), id="publications an array"),
        pytest.param(message(publications={"pub": "id"}), id="column names a string"),
        pytest.param(column(not_null="yes"), id="not_null a string"),
        pytest.param(column(attnum=70000), id="attnum out of range"),
        pytest.param(column(type_modifier=2**40), id="type modifier out of range"),
        pytest.param(column(generated="x"), id="unknown attgenerated"),
        pytest.param(column(name="\ud800"), id="a lone surrogate"),
        pytest.param(message(replica_identity="z"), id="unknown replica identity"),
        pytest.param(message()[:-1] + b"\xff\xfe}", id="invalid UTF-8"),
        pytest.param(b"\x00\x01 not a schema", id="binary"),
        pytest.param(b"", id="empty"),
        pytest.param(b"x" * (MAX_MESSAGE_BYTES + 1), id="larger than a trigger message"),
    ],
)
def test_hostile_content_raises_source_error_only(content: bytes) -> None:
    with pytest.raises(SourceError) as caught:
        parse_schema_change(content)
    assert caught.value.hint is not None and "reinstall" in caught.value.hint
    assert len(caught.value.message) < 400, "the message quotes no large part of the content"
