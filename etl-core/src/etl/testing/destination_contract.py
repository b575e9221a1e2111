"""The destination contract: tests every destination must pass, for built-in and third-party ones alike.

Subclass ``DestinationContract`` and give one fixture, ``destination``: a started destination (shut down
after the test) writing somewhere empty. Destinations that read tables back (``PreviewableDestination``)
need nothing else; others override ``read_rows``.

::

    from etl.testing.destination_contract import DestinationContract

    class TestMyDestination(DestinationContract):
        @pytest.fixture
        def destination(self, tmp_path):
            destination = MyDestination(MyDestination.Config(path=str(tmp_path)), pipeline_id=1)
            destination.startup()
            yield destination
            destination.shutdown()

The tests drive the destination as the engine does: a copy is ``drop_table_for_copy`` then
``write_table_rows``; a write reported ``ACCEPTED`` is followed by ``flush`` before anything reads it.
Batches come from ``etl.testing.batches.BatchBuilder``: Arrow change tables and events both. They check:

- copies, an empty table's included, and a copy again replacing the table (a resync);
- a write reported durable is readable at once, an accepted one after ``flush``;
- replayed batches change nothing (delivery is at-least-once);
- truncates;
- schema changes (added, renamed and dropped columns) between changes, and replayed;
- updates that change the key;
- tables without a key (``REPLICA IDENTITY FULL``), where equal rows are kept apart;
- unchanged TOAST values (not sent by Postgres) keeping the stored value.

Values are bigints and text only, which every reader returns as Python ``int`` and ``str``: types are
each destination's own tests' business.
"""

from __future__ import annotations

from typing import Any

from etl.destination.base import Destination, PreviewableDestination, WriteResult
from etl.events import EventBatch
from etl.lsn import Lsn
from etl.schema import ColumnSchema, ReplicaIdentity, TableName, TableSchema
from etl.testing.batches import BatchBuilder, rows_table

BIGINT, TEXT = 20, 25

ITEMS = TableSchema(
    16384,
    TableName("public", "contract_items"),
    (
        ColumnSchema("id", BIGINT, nullable=False, primary_key=True, attnum=1),
        ColumnSchema("note", TEXT, attnum=2),
        ColumnSchema("qty", BIGINT, attnum=3),
    ),
)
EMPTY = TableSchema(
    16385,
    TableName("public", "contract_empty"),
    (ColumnSchema("id", BIGINT, nullable=False, primary_key=True, attnum=1), ColumnSchema("note", TEXT, attnum=2)),
)
LOG = TableSchema(
    16386,
    TableName("public", "contract_log"),
    (ColumnSchema("line", TEXT, attnum=1), ColumnSchema("qty", BIGINT, attnum=2)),
    replica_identity=ReplicaIdentity.FULL,
)
DOCS = TableSchema(
    16387,
    TableName("public", "contract_docs"),
    (
        ColumnSchema("id", BIGINT, nullable=False, primary_key=True, attnum=1),
        ColumnSchema("body", TEXT, attnum=2),
        ColumnSchema("title", TEXT, attnum=3),
    ),
)
BODY = "x" * 10_000
"""A value Postgres would TOAST, so an update that leaves it alone does not send it."""


def item(i: int, note: str | None = None, qty: int | None = None) -> dict[str, Any]:
    return {"id": i, "note": f"n{i}" if note is None else note, "qty": i * 10 if qty is None else qty}


def _version(builder: BatchBuilder, columns: tuple[ColumnSchema, ...]) -> TableSchema:
    """A new version of ``ITEMS`` with these columns, made at the transaction ``builder`` is at (as the engine
    stamps the versions it reads from the stream)."""
    return TableSchema(ITEMS.id, ITEMS.name, columns, snapshot_lsn=Lsn(builder.lsn))


def _sort_key(row: dict[str, Any]) -> list[tuple[bool, str]]:
    return [(v is None, repr(v)) for v in row.values()]


class DestinationContract:
    """The tests; see the module docstring. The fixture ``destination`` is the subclass's to give."""

    # -- how the tests read and write; override read_rows for a destination without preview --------------
    def read_rows(self, destination: Destination, schema: TableSchema) -> list[dict[str, Any]]:
        """The table's current rows, as dicts of ``schema``'s columns; ``KeyError`` when there is no such table.

        By default through ``PreviewableDestination.preview``.
        """
        if not isinstance(destination, PreviewableDestination):
            raise NotImplementedError(f"{type(destination).__name__} has no preview: override read_rows")
        preview = destination.preview(schema.name, 1_000_000)
        return [{name: row.get(name) for name in schema.column_names} for row in preview.rows]

    def rows(self, destination: Destination, schema: TableSchema) -> list[dict[str, Any]]:
        return sorted(self.read_rows(destination, schema), key=_sort_key)

    def copy(self, destination: Destination, schema: TableSchema, rows: list[dict[str, Any]]) -> None:
        destination.drop_table_for_copy(schema)
        if destination.write_table_rows(schema, rows_table(schema, rows)) is WriteResult.ACCEPTED:
            destination.flush()

    def write(self, destination: Destination, batch: EventBatch) -> None:
        if destination.write_events(batch) is WriteResult.ACCEPTED:
            destination.flush()

    def expect(self, destination: Destination, schema: TableSchema, rows: list[dict[str, Any]]) -> None:
        assert self.rows(destination, schema) == sorted(rows, key=_sort_key), f"rows of {schema.name}"

    # -- the contract ---------------------------------------------------------------------------------
    def test_copy_writes_every_row(self, destination: Destination) -> None:
        self.copy(destination, ITEMS, [item(i) for i in range(1, 6)])
        self.expect(destination, ITEMS, [item(i) for i in range(1, 6)])

    def test_copy_of_an_empty_table_creates_it(self, destination: Destination) -> None:
        self.copy(destination, EMPTY, [])
        assert self.rows(destination, EMPTY) == []

    def test_a_copy_again_replaces_the_table(self, destination: Destination) -> None:
        self.copy(destination, ITEMS, [item(1), item(2)])
        self.write(destination, BatchBuilder().commit().insert(ITEMS, item(3)).build())
        self.copy(destination, ITEMS, [item(2, "again"), item(4)])
        self.expect(destination, ITEMS, [item(2, "again"), item(4)])

    def test_a_write_is_readable_once_durable(self, destination: Destination) -> None:
        """Durable when reported ``DURABLE``; when reported ``ACCEPTED``, once ``flush`` returns."""
        self.copy(destination, ITEMS, [item(1)])
        result = destination.write_events(BatchBuilder().commit().insert(ITEMS, item(2)).build())
        if result is WriteResult.ACCEPTED:
            destination.flush()
        self.expect(destination, ITEMS, [item(1), item(2)])

    def test_replayed_batches_change_nothing(self, destination: Destination) -> None:
        """After a crash the engine replays from its last durable progress: changes already applied come again,
        and must change nothing, in a table with a key and in one without."""
        self.copy(destination, ITEMS, [item(i) for i in range(1, 4)])
        self.copy(destination, LOG, [])
        builder = BatchBuilder()
        builder.commit().insert(ITEMS, item(4)).update(ITEMS, item(1, "one")).delete(ITEMS, {"id": 2})
        first = builder.insert(LOG, {"line": "first", "qty": 1}).build()
        second = builder.commit().insert(ITEMS, item(2, "back")).update(ITEMS, item(4, qty=7)).build()
        self.write(destination, first)
        self.write(destination, second)
        for batch in (first, second, second):
            self.write(destination, batch)
            self.expect(destination, ITEMS, [item(1, "one"), item(2, "back"), item(3), item(4, qty=7)])
            self.expect(destination, LOG, [{"line": "first", "qty": 1}])

    def test_truncate_empties_the_table(self, destination: Destination) -> None:
        self.copy(destination, ITEMS, [item(1), item(2)])
        batch = BatchBuilder().commit().insert(ITEMS, item(3)).commit().truncate(ITEMS).commit().insert(ITEMS, item(4))
        self.write(destination, batch.build())
        self.expect(destination, ITEMS, [item(4)])

    def test_schema_changes_between_changes(self, destination: Destination) -> None:
        """Columns added, renamed and dropped at the source between changes of one batch, and in the next."""
        self.copy(destination, ITEMS, [item(1), item(2)])
        id_, note, qty = ITEMS.columns
        label, extra = ColumnSchema("label", TEXT, attnum=2), ColumnSchema("extra", BIGINT, attnum=4)
        builder = BatchBuilder().commit().insert(ITEMS, item(3)).commit()
        wider = _version(builder, (id_, note, qty, extra))
        builder.insert(wider, {**item(4), "extra": 40}).update(wider, {**item(1), "extra": 10})
        self.write(destination, builder.build())
        renamed = _version(builder.commit(), (id_, label, qty, extra))
        builder.update(renamed, {"id": 2, "label": "two", "qty": 20, "extra": 2})
        dropped = _version(builder.commit(), (id_, label, extra))
        builder.insert(dropped, {"id": 5, "label": "five", "extra": 50})
        self.write(destination, builder.build())
        self.expect(
            destination,
            dropped,
            [
                {"id": 1, "label": "n1", "extra": 10},
                {"id": 2, "label": "two", "extra": 2},
                {"id": 3, "label": "n3", "extra": None},
                {"id": 4, "label": "n4", "extra": 40},
                {"id": 5, "label": "five", "extra": 50},
            ],
        )

    def test_a_replayed_schema_change_changes_nothing(self, destination: Destination) -> None:
        """A replay sends schema versions again too: an older one must not take back a column added since, nor
        the values written into it."""
        self.copy(destination, ITEMS, [item(1)])
        builder = BatchBuilder()
        first = builder.commit().insert(ITEMS, item(2)).build()
        wider = _version(builder.commit(), (*ITEMS.columns, ColumnSchema("extra", BIGINT, attnum=4)))
        second = builder.update(wider, {**item(1), "extra": 10}).insert(wider, {**item(3), "extra": 30}).build()
        for batch in (first, second, first, second):
            self.write(destination, batch)
        self.expect(
            destination, wider, [{**item(1), "extra": 10}, {**item(2), "extra": None}, {**item(3), "extra": 30}]
        )

    def test_an_update_can_change_the_key(self, destination: Destination) -> None:
        self.copy(destination, ITEMS, [item(1), item(2)])
        builder = BatchBuilder().commit().update(ITEMS, item(10, "moved"), old={"id": 1})
        builder.commit().insert(ITEMS, item(1, "new one")).update(ITEMS, item(20, "moved too"), old={"id": 2})
        self.write(destination, builder.build())
        self.write(destination, BatchBuilder(builder.lsn).commit().update(ITEMS, item(30), old={"id": 20}).build())
        self.expect(destination, ITEMS, [item(1, "new one"), item(10, "moved"), item(30)])

    def test_a_table_without_a_key_keeps_equal_rows_apart(self, destination: Destination) -> None:
        """``REPLICA IDENTITY FULL``: a delete or an update removes one occurrence of its old row, not all."""
        a, b = {"line": "a", "qty": 1}, {"line": "b", "qty": 2}
        self.copy(destination, LOG, [a, a, b])
        builder = BatchBuilder().commit().insert(LOG, a).insert(LOG, b).commit().delete(LOG, a)
        builder.commit().update(LOG, {"line": "b", "qty": 3}, old=b)
        self.write(destination, builder.build())
        self.expect(destination, LOG, [a, a, b, {"line": "b", "qty": 3}])

    def test_unchanged_toast_values_keep_the_stored_value(self, destination: Destination) -> None:
        """An update that leaves a TOASTed value alone does not carry it: the stored (or earlier) value stays."""
        self.copy(destination, DOCS, [{"id": 1, "body": BODY, "title": "a"}, {"id": 2, "body": BODY, "title": "b"}])
        builder = BatchBuilder().commit().update(DOCS, {"id": 1, "title": "a2"}, missing=("body",))
        builder.commit().insert(DOCS, {"id": 3, "body": "short", "title": "c"})
        builder.commit().update(DOCS, {"id": 3, "title": "c2"}, missing=("body",))
        self.write(destination, builder.build())
        self.write(
            destination, BatchBuilder(builder.lsn).commit().update(DOCS, {"id": 2}, missing=("body", "title")).build()
        )
        self.expect(
            destination,
            DOCS,
            [
                {"id": 1, "body": BODY, "title": "a2"},
                {"id": 2, "body": BODY, "title": "b"},
                {"id": 3, "body": "short", "title": "c2"},
            ],
        )
