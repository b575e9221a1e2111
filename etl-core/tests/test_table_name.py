"""Table names as people write and read them: ``schema.table`` with Postgres's quoting rules."""

from __future__ import annotations

import pytest

from etl.errors import EtlError
from etl.schema import TableName, TableNameError

PARSED = [
    ("public.items", TableName("public", "items")),
    ("items", TableName("public", "items")),
    ("Sales.Orders", TableName("sales", "orders")),  # unquoted names fold to lower case, as in SQL
    ('public."a.b"', TableName("public", "a.b")),
    ('"public.a".b', TableName("public.a", "b")),
    ('"My Schema"."Order ""Items"""', TableName("My Schema", 'Order "Items"')),
    ('"Mixed"', TableName("public", "Mixed")),
    (" public.items ", TableName("public", "items")),
    ("café.naïve", TableName("café", "naïve")),
]


def test_parse_reads_quoted_parts() -> None:
    assert {text: TableName.parse(text) for text, _ in PARSED} == dict(PARSED)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("public.", "a name is missing at its end"),
        (".items", "a name is missing at its start"),
        ("public..items", "a name is missing between two dots"),
        ("", "it is empty"),
        ('public."items', "a double quote is not closed"),
        ('"public.items', "a double quote is not closed"),
        ('pub"lic.items', "a double quote inside the unquoted name 'pub'"),
        ('"a"b.c', "unexpected 'b' after the quoted name 'a'"),
        ('"".items', '"" is an empty name'),
        ("db.public.items", "it has 3 dot-separated parts, expected schema.table"),
        ("my table", "the unquoted name 'my table' holds a space"),
    ],
)
def test_malformed_names_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(TableNameError) as info:
        TableName.parse(text)
    assert problem in info.value.message and repr(text) in info.value.message
    assert info.value.hint is not None and 'public."Order Items"' in info.value.hint
    assert isinstance(info.value, EtlError) and isinstance(info.value, ValueError)


SHOWN = [
    (TableName("public", "items"), "public.items"),
    (TableName("public", "a.b"), 'public."a.b"'),
    (TableName("public.a", "b"), '"public.a".b'),
    (TableName("Sales", "order items"), '"Sales"."order items"'),
    (TableName("s", 'say "hi"'), 's."say ""hi"""'),
    (TableName("s", "t$1"), 's."t$1"'),
    (TableName("s", "1st"), 's."1st"'),
    (TableName("s", "_x9"), "s._x9"),
]


def test_str_quotes_where_needed_and_reads_back() -> None:
    assert [str(name) for name, _ in SHOWN] == [shown for _, shown in SHOWN]
    assert [TableName.parse(str(name)) for name, _ in SHOWN] == [name for name, _ in SHOWN]


def test_names_that_differ_only_in_where_the_dot_is_render_differently() -> None:
    assert str(TableName("public", "a.b")) != str(TableName("public.a", "b"))
