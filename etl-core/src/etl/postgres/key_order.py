"""A table's key order as the source has it: the stream's keys compared with an incremental copy's bounds by the
source itself, under each column's type and collation (text under a locale, enums, numeric, composite keys): no
comparison in Python could match every collation.

One statement per call, on a connection of its own in autocommit (it holds no snapshot between calls), opened on
first use and again after it was lost. Keys go over as text arrays in Postgres's text form (psycopg's dumpers, which
also take the text form that values Python cannot hold come back as: ``codecs.python_values``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg.adapt import PyFormat, Transformer

from etl.config import PostgresConnection
from etl.errors import TransientError
from etl.key_sql import KeyValue, key_column_gone
from etl.postgres.codecs import python_values
from etl.postgres.connection import connect
from etl.schema import TableId, quote_ident

_COLUMNS = """
SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
       coalesce(pg_catalog.quote_ident(n.nspname) || '.' || pg_catalog.quote_ident(c.collname), '')
FROM pg_catalog.pg_attribute a
LEFT JOIN pg_catalog.pg_collation c ON c.oid OPERATOR(pg_catalog.=) a.attcollation
LEFT JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.collnamespace
WHERE a.attrelid OPERATOR(pg_catalog.=) %s AND a.attnum > 0 AND NOT a.attisdropped
"""


@dataclass
class SourceComparisons:
    """The connection the copies' key comparisons run on; ``close`` when the copies end."""

    config: PostgresConnection
    _conn: psycopg.Connection[Any] | None = field(default=None, init=False, repr=False)

    def run(self, query: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._connection().execute(query, params).fetchall()
        except psycopg.OperationalError as exc:
            self.close()
            raise TransientError(
                f"comparing keys of an incremental copy on {self.config.describe()} failed: {exc}",
                hint="the connection to the source was lost; the batch is tried again",
            ) from None

    def dumped(self, values: list[Any]) -> list[str]:
        """Each value in Postgres's text form, as psycopg writes it."""
        transformer = Transformer(self._connection())
        out = []
        for value in values:
            if isinstance(value, str):
                out.append(value)
                continue
            dumped = transformer.get_dumper(value, PyFormat.TEXT).dump(value)
            assert dumped is not None  # of no null: they are left out
            out.append(bytes(dumped).decode())
        return out

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.config, retried=True)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass
class SourceKeyOrder:
    """The order of table ``table_id``'s key ``columns`` (``incremental.KeyOrder``), asked of the source."""

    comparisons: SourceComparisons
    table_id: TableId
    columns: tuple[str, ...]
    _types: list[tuple[str, str]] | None = field(default=None, init=False, repr=False)
    """Each key column's type (``format_type``, schema-qualified where not in ``pg_catalog``) and collation."""

    def at_most(self, keys: Sequence[pa.Array | pa.ChunkedArray], bound: KeyValue) -> np.ndarray:
        valid = np.ones(len(keys[0]), np.bool_)
        for column in keys:
            valid &= pc.is_valid(column).to_numpy(zero_copy_only=False)
        found = np.zeros(len(valid), np.bool_)
        if not valid.any():
            return found
        mask = pa.array(valid)
        arrays = [self.comparisons.dumped(python_values(pc.filter(column, mask))) for column in keys]
        (flags,) = self.comparisons.run(self._query(self._key_types()), [*bound, *arrays])[0]
        found[valid] = np.frombuffer(flags.encode(), np.uint8) == ord("t")
        return found

    def not_after(self, value: KeyValue, bound: KeyValue) -> bool:
        types = self._key_types()
        left = ", ".join(self._typed("%s", t, c) for t, c in types)
        (result,) = self.comparisons.run(
            f"SELECT ROW({left}) OPERATOR(pg_catalog.<=) {self._bound(types)}", [*value, *bound]
        )[0]
        return bool(result)

    def _query(self, types: list[tuple[str, str]]) -> str:
        names = [f"c{i}" for i in range(len(types))]
        left = ", ".join(self._typed(f"k.{n}", None, c) for n, (_, c) in zip(names, types, strict=True))
        unnest = ", ".join(f"pg_catalog.unnest(%s::pg_catalog.text[]::{t}[])" for t, _ in types)
        flag = f"CASE WHEN ROW({left}) OPERATOR(pg_catalog.<=) {self._bound(types)} THEN 't' ELSE 'f' END"
        return (
            f"SELECT coalesce(pg_catalog.string_agg({flag}, '' ORDER BY k.n), '')"
            f" FROM ROWS FROM ({unnest}) WITH ORDINALITY AS k({', '.join(names)}, n)"
        )

    @staticmethod
    def _bound(types: list[tuple[str, str]]) -> str:
        return f"ROW({', '.join(f'%s::pg_catalog.text::{t}' for t, _ in types)})"

    @staticmethod
    def _typed(expression: str, type_name: str | None, collation: str) -> str:
        typed = expression if type_name is None else f"{expression}::pg_catalog.text::{type_name}"
        return f"({typed} COLLATE {collation})" if collation else typed

    def _key_types(self) -> list[tuple[str, str]]:
        if self._types is None:
            found = {name: (t, c) for name, t, c in self.comparisons.run(_COLUMNS, [self.table_id])}
            missing = [c for c in self.columns if c not in found]
            if missing:
                gone = f"the key column {quote_ident(missing[0])} of table oid {self.table_id} is gone from the source"
                raise key_column_gone(self.table_id, gone)
            self._types = [found[c] for c in self.columns]
        return self._types


_INDEX_COLUMNS = """
SELECT a.attname, o.opcdefault AND i.indcollation[k.n - 1] OPERATOR(pg_catalog.=) a.attcollation
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_index i ON i.indrelid OPERATOR(pg_catalog.=) c.oid
 AND CASE WHEN c.relreplident OPERATOR(pg_catalog.=) 'i' THEN i.indisreplident ELSE i.indisprimary END
CROSS JOIN LATERAL pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(attnum, n)
JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.=) k.attnum
JOIN pg_catalog.pg_opclass o ON o.oid OPERATOR(pg_catalog.=) i.indclass[k.n - 1]
WHERE c.oid OPERATOR(pg_catalog.=) %s
ORDER BY k.n
"""


NO_KEY: Final = "it has no primary key or replica identity index"
"""Why a table without a key gets a snapshot copy."""


def key_index_order(
    conn: psycopg.Connection[Any], table_id: TableId, key: Sequence[str] | None = None
) -> tuple[tuple[str, ...] | None, str]:
    """The columns of the index that makes the table's key (``key``, when given: of those columns), in that index's
    order, which chunks are read in (so each chunk is a range of the index); or ``None`` and why not, in words: no
    such index, or one that does not order as ``ORDER BY`` does (an operator class or a collation of its own)."""
    found = conn.execute(_INDEX_COLUMNS, [table_id]).fetchall()
    if not found or (key is not None and sorted(name for name, _ in found) != sorted(key)):
        return None, NO_KEY
    if not all(usual for _, usual in found):
        return None, "its key's index orders by an operator class or a collation of its own"
    return tuple(name for name, _ in found), ""


PARTITION_ROOT: Final = "it is published through its partition root"
"""Why a partitioned table published through its root gets a snapshot copy: chunks read ``ONLY`` one table."""


def snapshot_copy_reason(conn: psycopg.Connection[Any], table_id: TableId) -> str:
    """Why an incremental copy of published table ``table_id`` would be a snapshot copy instead, in words; '' when
    it would not (as ``replication.chunked_copy.chunk_key`` decides)."""
    row = conn.execute("SELECT relkind FROM pg_catalog.pg_class WHERE oid OPERATOR(pg_catalog.=) %s", [table_id])
    if (found := row.fetchone()) is not None and found[0] == "p":
        return PARTITION_ROOT
    return key_index_order(conn, table_id)[1]
