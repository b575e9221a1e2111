"""One table's changes under one schema version within a batch: kept raw as the decoder found them, decoded into
Arrow columns at once when the batch is built (``ChangeBuilder.build``), in the columns of ``change_schema``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from etl.errors import TableError
from etl.events import (
    COMMIT_LSN_COLUMN,
    METADATA_COLUMNS,
    MISSING_COLUMN,
    OLD_COLUMN,
    OLD_IS_KEY_COLUMN,
    OP_COLUMN,
    TX_ORDINAL_COLUMN,
)
from etl.postgres.codecs import arrow_field, decode_text_column
from etl.postgres.pgoutput import (
    UNCHANGED_TOAST,
    OldKind,
    TupleColumns,
    TupleData,
    TupleWidthError,
    tuple_columns,
)
from etl.schema import TableId, TableSchema


@lru_cache(maxsize=256)
def change_schema(schema: TableSchema) -> pa.Schema:
    """The Arrow schema of a table's change segments: the row columns, then the ``_etl_*`` metadata columns."""
    clash = [c.name for c in schema.columns if c.name in METADATA_COLUMNS]
    if clash:
        raise TableError(
            f"table {schema.name}: column {clash[0]} has the name of a column the engine adds to change tables",
            hint="rename the column at the source, or leave it out of the publication (a column list), then resync"
            " the table",
            table_id=schema.id,
        )
    fields = [arrow_field(c) for c in schema.columns]
    return pa.schema(
        [
            *fields,
            pa.field(OP_COLUMN, pa.string(), nullable=False),
            pa.field(COMMIT_LSN_COLUMN, pa.uint64(), nullable=False),
            pa.field(TX_ORDINAL_COLUMN, pa.int64(), nullable=False),
            pa.field(MISSING_COLUMN, pa.list_(pa.string())),
            pa.field(OLD_COLUMN, pa.struct(fields)),
            pa.field(OLD_IS_KEY_COLUMN, pa.bool_()),
        ]
    )


class Segment:
    """Changes of one table under one schema version, as appended (raw tuples, row-wise).

    A row is kept as its payload and the offset of its tuple there, not as a ``TupleData``: plain
    bytes and ints are not tracked by the garbage collector, whose passes over a batch's worth of
    per-row objects otherwise cost a fifth of the streaming time.
    """

    __slots__ = (
        "lsns",
        "number",
        "old_kinds",
        "old_rows",
        "ops",
        "ordinals",
        "payloads",
        "schema",
        "start_lsns",
        "starts",
        "table_id",
        "width",
    )

    def __init__(self, number: int, table_id: TableId, schema: TableSchema) -> None:
        self.number = number
        """Its position among the batch's segments (``ChangeBuilder._segment_list``)."""
        self.table_id = table_id
        self.schema = schema
        self.width = len(schema.columns)
        self.payloads: list[bytes | None] = []
        """The payload of the new row of inserts and updates, of the old row of deletes; ``None`` for truncates."""
        self.starts: list[int] = []
        """Where the row's tuple starts in its payload."""
        self.ops: list[str] = []
        self.lsns: list[int] = []
        self.ordinals: list[int] = []
        self.start_lsns: list[int] = []
        self.old_kinds: dict[int, OldKind | None] = {}
        """Row index -> old row kind, for every update and delete."""
        self.old_rows: dict[int, TupleData] = {}
        """Row index -> the old row of an update, when Postgres sent one."""

    def build(self) -> pa.Table:
        schema, n = self.schema, len(self.ops)
        new = self._parse(self.payloads, self.starts)
        texts, missing_names = new.text, None
        if any(mask is not None for mask in new.unchanged):
            texts, missing_names = self._recover_unchanged(new)
        columns = self._decode(texts)
        missing = (
            pa.array(missing_names, pa.list_(pa.string())) if missing_names else pa.nulls(n, pa.list_(pa.string()))
        )
        old_is_key = pa.nulls(n, pa.bool_())
        if self.old_kinds:
            is_key = np.zeros(n, np.bool_)
            is_key[list(self.old_kinds)] = [kind == "K" for kind in self.old_kinds.values()]
            old_is_key = pa.array(is_key, mask=_absent(n, self.old_kinds))
        arrays = [
            *columns,
            pa.array(self.ops, pa.string()),
            pa.array(self.lsns, pa.uint64()),
            pa.array(self.ordinals, pa.int64()),
            missing,
            self._old_struct(n),
            old_is_key,
        ]
        return pa.Table.from_arrays(arrays, schema=change_schema(schema))

    def _parse(self, payloads: Sequence[bytes | None], starts: Sequence[int]) -> TupleColumns:
        try:
            return tuple_columns(payloads, starts, self.width)
        except TupleWidthError as exc:
            raise TableError(
                f"table {self.schema.name}: rows with {exc.widths} columns do not match its schema of"
                f" {self.width} columns",
                hint="the stored schema is out of date; resync the table",
                table_id=self.table_id,
            ) from None

    def _decode(self, texts: list[pa.Array]) -> list[pa.Array]:
        try:
            return [
                decode_text_column(column, values) for column, values in zip(self.schema.columns, texts, strict=True)
            ]
        except TableError as exc:
            message = f"table {self.schema.name}: {exc.message}"
            raise TableError(message, hint=exc.hint, table_id=self.table_id) from None

    def _recover_unchanged(self, new: TupleColumns) -> tuple[list[pa.Array], list[list[str] | None]]:
        """Fill unchanged TOAST values of updates from the old row where Postgres sent them; name the rest.

        An update's old row holds every column under REPLICA IDENTITY FULL (``O``), else the key
        columns only (``K``, when the key changed). Values found in neither stay null and are listed
        in ``_etl_missing``.
        """
        columns = self.schema.columns
        masks = [mask if mask is not None else np.zeros(len(self.ops), np.bool_) for mask in new.unchanged]
        missing: list[list[str] | None] = [None] * len(self.ops)
        replacements: list[list[str | None]] = [[] for _ in columns]
        for i in np.flatnonzero(np.logical_or.reduce(masks)).tolist():
            old, old_kind = self.old_rows.get(i), self.old_kinds.get(i)
            old_values = _plain(old) if old is not None else None
            for c, column in enumerate(columns):
                if not masks[c][i]:
                    continue
                if old_values is not None and (old_kind == "O" or column.primary_key):
                    replacements[c].append(old_values[c])  # sent in the old row
                    continue
                replacements[c].append(None)
                if self.ops[i] == "U":
                    missing[i] = [*(missing[i] or []), column.name]
        texts = [
            text if mask is None else pc.replace_with_mask(text, mask, pa.array(values, pa.string()))
            for text, mask, values in zip(new.text, new.unchanged, replacements, strict=True)
        ]
        return texts, missing

    def _old_struct(self, n: int) -> pa.Array:
        fields = [arrow_field(c) for c in self.schema.columns]
        if not self.old_rows:
            return pa.nulls(n, pa.struct(fields))
        payloads: list[bytes | None] = [None] * n
        starts = [0] * n
        for i, row in self.old_rows.items():
            payloads[i], starts[i] = row.data, row.start
        columns = self._decode(self._parse(payloads, starts).text)  # unchanged TOAST in an old row reads as null
        return pa.StructArray.from_arrays(columns, fields=fields, mask=pa.array(_absent(n, self.old_rows)))


def _absent(n: int, present: Iterable[int]) -> npt.NDArray[np.bool_]:
    """A mask of ``n`` rows, true except at the ``present`` indices."""
    mask = np.ones(n, np.bool_)
    mask[list(present)] = False
    return mask


def _plain(values: TupleData) -> tuple[str | None, ...]:
    """A tuple's values with an unchanged TOAST marker (never expected in old rows) read as unknown (null)."""
    return tuple(None if v is UNCHANGED_TOAST else v for v in values)  # type: ignore[misc]
