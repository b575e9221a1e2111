"""What one table contributes to a snapshot, computed with Spark before the catalog transaction.

A ``TablePlan`` holds the schema change, the new data files (already written) or the rows to inline
into the catalog, the positions to delete per data file, the inlined rows to end, and the new
watermark. ``apply`` registers it all inside the commit; delete files are written there because
their rows record the snapshot id, known only then.

A batch's upserts for a table are inlined (``catalog.inlined``) when they fit in the table's share of the
batch's inlining budget (``inline_limits``) and the table's columns can be: no Spark job, no file. A plan never
changes the columns of a table with inlined rows: it raises ``FlushFirst``, and the caller
flushes them (``inline_flush``) and plans again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa
import pyarrow.compute as pc
import structlog

from etl.api import OP_COLUMN, ColumnSchema, TableChanges, TableError, TableSchema
from etl_spark.collapse import (
    ACTION,
    UPSERT,
    Position,
    after,
    after_last_truncate,
    last_change_per_key_arrow,
    last_position,
    missing_columns,
    net_changes_without_key,
)
from etl_spark.ducklake.catalog import (
    ColumnIds,
    DataFile,
    DeleteFile,
    Handle,
    LakeColumn,
    LakeTable,
    NewColumn,
    NewFile,
    SourceColumn,
    Transaction,
    assign_column_ids,
)
from etl_spark.ducklake.catalog.column_ids import ELEMENT
from etl_spark.ducklake.catalog.inlined import inlinable
from etl_spark.ducklake.lake import Lake
from etl_spark.ducklake.parquet_files import SNAPSHOT, DataFileSpec
from etl_spark.ducklake.scan import read_rows
from etl_spark.ducklake.schema_diff import SchemaDiff, diff
from etl_spark.ducklake.storage import LakeStorage
from etl_spark.ducklake.stored_rows import (
    StoredValues,
    copies,
    file_positions,
    fill_from_lake,
    live_rows,
    matched_positions,
    matched_positions_and_inlined,
    may_hold,
    occurrences,
    removed_copies,
)
from etl_spark.ducklake.table_state import TableState, read_states
from etl_spark.ducklake.types import Form, LakeType, convert, lake_type

log = structlog.get_logger(__name__)

BEFORE_FIRST = -1
"""A transaction ordinal below every change's: a watermark at ``(lsn, BEFORE_FIRST)`` lets all changes at
``lsn`` in."""


@dataclass
class TablePlan:
    schema: TableSchema
    handle: Handle | None
    directory: str
    schema_diff: SchemaDiff
    new_column_ids: list[int]
    sources: dict[int, SourceColumn] = field(default_factory=dict)
    """Column id -> the source column it holds, recorded when it differs from what the lake has."""
    truncate: bool = False
    files: list[NewFile] = field(default_factory=list)
    deletes: dict[int, tuple[DataFile, pa.Array]] = field(default_factory=dict)
    inline: pa.Table | None = None
    """Rows to inline instead of writing files."""
    ended_inlined: list[int] = field(default_factory=list)
    """Row ids of inlined rows that were deleted or replaced."""
    watermark: Position | None = None
    written_keys: tuple[int, pa.ChunkedArray] | None = None
    """The key column's id and its values in ``files``, in file order (a one-column integer or text key, rows
    written on the driver)."""
    applied: LakeTable | None = None
    """The lake table as the plan's commit left it (set by ``apply``)."""
    registered: list[tuple[int, str, int]] = field(default_factory=list)
    """Each file's data file id, path and row count, as the plan's commit registered them (set by ``apply``)."""
    registered_deletes: list[tuple[DeleteFile, pa.Table]] = field(default_factory=list)
    """The delete files the plan's commit registered, with their positions (set by ``apply``)."""
    check_since: int | None = None
    """For a plan that holds an open transaction's earlier parts (``open_transaction``): the lake's latest snapshot
    before the first of them, after which no other writer may have changed the table but by inserting."""

    def apply(self, txn: Transaction, storage: LakeStorage, current: LakeTable | None) -> None:
        """Register the plan in ``txn``; ``current`` is its lake table as ``txn`` reads it (``None`` for a new one)."""
        self.registered_deletes = []
        table = self.applied = self._table(txn, current)
        self._record_sources(txn, table)
        if self.truncate:
            txn.end_data_files(table)
        self.registered = [
            (txn.add_data_file(table, file), table.directory + file.name, file.record_count) for file in self.files
        ]
        if self.ended_inlined:  # first: it may find them changed, before any delete file is written
            txn.end_inlined_rows(table, self.ended_inlined)
        ids = {path: data_file_id for data_file_id, path, _ in self.registered}
        for data_file, positions in self.deletes.values():
            target = data_file
            if data_file.data_file_id < 0:  # a file of an open transaction's part, registered just above
                target = replace(data_file, data_file_id=ids[data_file.path])
            self._delete(txn, storage, table, target, positions)
        if self.inline is not None:
            txn.inline_rows(table, self.inline)
        if self.watermark is not None:
            txn.set_watermark(self.schema.id, table.table_id, self.watermark)

    def _table(self, txn: Transaction, current: LakeTable | None) -> LakeTable:
        if current is None:
            columns = [NewColumn(c.name, lake_type(c), c.nullable) for c in self.schema.columns]
            table = txn.create_table(
                self.schema.name.schema, self.schema.name.name, columns, source_table_id=self.schema.id
            )
            txn.set_watermark(self.schema.id, table.table_id, (0, 0))
            return table
        table = current
        if _renamed(table, self.schema):
            txn.rename_table(table, self.schema.name.schema, self.schema.name.name)
            table = txn.table(table.table_id)
        if self.schema_diff:
            for old, new_name in self.schema_diff.renames:
                txn.rename_column(table, old.column_id, new_name)
            for old, new_type in self.schema_diff.retypes:
                txn.retype_column(table, old.column_id, new_type)
            for old in self.schema_diff.drops:
                txn.drop_column(table, old.column_id)
            for column, column_id in zip(self.schema_diff.adds, self.new_column_ids, strict=True):
                txn.add_column(table, column, column_id)
            table = txn.table(table.table_id)
        return table

    def _record_sources(self, txn: Transaction, table: LakeTable) -> None:
        if _sources(table.columns) != self.sources:
            txn.set_source_columns(table.table_id, self.sources)

    def _delete(
        self, txn: Transaction, storage: LakeStorage, table: LakeTable, data_file: DataFile, positions: pa.Array
    ) -> None:
        new = pa.table({"pos": positions.cast(pa.int64())})
        if data_file.delete is None:
            rows, begin, partial = new.sort_by("pos"), txn.snapshot_id, False
        else:
            old = storage.deleted(data_file.delete)
            stamped = new.append_column(SNAPSHOT.name, pa.array([txn.snapshot_id] * new.num_rows, pa.int64()))
            rows = pa.concat_tables([old, stamped]).sort_by("pos")
            begin, partial = data_file.delete.begin_snapshot, True
        written = storage.write_delete(table, data_file.path, rows)
        delete = DeleteFile(txn.new_delete_file_id(), table.directory + written.name, begin, partial, rows.num_rows)
        txn.replace_delete_file(
            table,
            data_file=data_file,
            delete_file_id=delete.delete_file_id,
            file=written,
            begin_snapshot=begin,
            partial=partial,
        )
        self.registered_deletes.append((delete, rows))

    def remember_files(self, storage: LakeStorage) -> None:
        """Once committed: keep what later key lookups would read of the files written, as written: the delete
        files' positions, and the data files' key column (``written_keys``)."""
        for delete, positions in self.registered_deletes:
            storage.remember_deleted(delete, positions)
        if self.written_keys is None:
            return
        column_id, values = self.written_keys
        start = 0
        for data_file_id, path, rows in self.registered:
            storage.remember_keys(data_file_id, path, column_id, values.slice(start, rows))
            start += rows

    def discard(self, storage: LakeStorage) -> None:
        """Remove the data files of a plan that was not committed."""
        if self.files:
            storage.remove(self.directory, self.files)


class FlushFirst(Exception):
    """Plans would change the columns of tables that have inlined rows: flush them, then plan again."""

    def __init__(self, *tables: LakeTable) -> None:
        super().__init__(f"flush the inlined rows of DuckLake tables {[t.table_id for t in tables]} first")
        self.tables = tables


def _target_columns(schema: TableSchema, state: TableState) -> tuple[SchemaDiff, list[int], list[LakeColumn]]:
    """The schema change to make and the lake columns (ids, and the source columns) the new files carry."""
    handle = state.handle
    if handle is None:
        types = [lake_type(c) for c in schema.columns]
        numbered = assign_column_ids(
            [NewColumn(c.name, t, c.nullable) for c, t in zip(schema.columns, types, strict=True)]
        )
        columns = [_new_column(c, t, i) for c, t, i in zip(schema.columns, types, numbered, strict=True)]
        return SchemaDiff(), [], columns
    change = diff(handle.table.columns, schema)
    added = assign_column_ids(change.adds, state.max_column_id + 1)
    renamed = {old.column_id: name for old, name in change.renames}
    retyped = {old.column_id: new_type for old, new_type in change.retypes}
    dropped = {c.column_id for c in change.drops}
    by_name: dict[str, LakeColumn] = {}
    for old in handle.table.columns:
        if old.column_id not in dropped:
            name = renamed.get(old.column_id, old.name)
            by_name[name] = replace(old, type=retyped.get(old.column_id, old.type))
    for column, ids in zip(change.adds, added, strict=True):  # older files read its initial default, as DuckDB
        new = _element(column.type, ids, column.name, column.nullable)
        by_name[column.name] = replace(new, initial_default=column.initial_default)
    columns = [
        replace(by_name[c.name], name=c.name, attnum=c.attnum, source_type=(c.type_oid, c.type_modifier))
        for c in schema.columns
    ]
    return change, [ids.column_id for ids in added], columns


def _new_column(column: ColumnSchema, kind: LakeType, ids: ColumnIds) -> LakeColumn:
    new = _element(kind, ids, column.name, column.nullable)
    return replace(new, attnum=column.attnum, source_type=(column.type_oid, column.type_modifier))


def _element(kind: LakeType, ids: ColumnIds, name: str = ELEMENT, nullable: bool = True) -> LakeColumn:
    """A lake column of ``kind`` under ``ids``, with its list elements."""
    element = None
    if kind.element is not None and ids.element is not None:
        element = _element(kind.element, ids.element)
    return LakeColumn(ids.column_id, name, kind.name, nullable, element=element)


def changes_table(schema: TableSchema, state: TableState) -> bool:
    """Whether changes of ``schema`` would create the table, or change its name or columns."""
    if state.handle is None:
        return True
    return bool(_target_columns(schema, state)[0]) or _renamed(state.handle.table, schema)


def _renamed(table: LakeTable, schema: TableSchema) -> bool:
    """Whether the source table's name (or schema) is no longer the lake table's."""
    return (table.schema_name, table.name) != (schema.name.schema, schema.name.name)


def _sources(columns: Sequence[LakeColumn]) -> dict[int, SourceColumn]:
    return {c.column_id: (c.attnum, *c.source_type) for c in columns if c.source_type is not None}


def _directory(lake: Lake, schema: TableSchema, handle: Handle | None) -> str:
    if handle is not None:
        return handle.table.directory
    return lake.catalog.table_directory(schema.name.schema, schema.name.name)


def _handle(schema: TableSchema, state: TableState) -> Handle | None:
    """The table's place in the lake, ``None`` before its first write; a lake table that is gone errors."""
    if state.handle is None and state.tracked:
        raise TableError(
            f"{schema.name}: its DuckLake table is gone (dropped in the lake by DuckDB or another writer)",
            hint="resync the table (etl resync --table ...) to copy it again",
        )
    return state.handle


def plan_copy(
    lake: Lake,
    schema: TableSchema,
    write: Callable[[DataFileSpec], list[NewFile]],
    watermark: Position | None = None,
) -> TablePlan:
    """The plan for copied rows, which ``write`` writes as data files (into the table, created when new); with a
    ``watermark``, an incremental copy's chunk of new keys at that place among the stream's changes, added to the
    table as it is."""
    state = read_states(lake.catalog, [schema])[schema.id]
    handle = _handle(schema, state)
    change, new_ids, columns = _target_columns(schema, state)
    if watermark is not None and handle is not None and change:  # a chunk into the table as it is
        _check_not_inlined(handle.table, state.inlined_tables)
    directory = _directory(lake, schema, handle)
    plan = TablePlan(schema, handle, directory, change, new_ids, _sources(columns), watermark=watermark)
    plan.files = write(_spec(lake, plan, columns))
    return plan


def _spec(lake: Lake, plan: TablePlan, columns: list[LakeColumn]) -> DataFileSpec:
    """The plan's data files: under the schema the table is in after the plan's commit (moved there by a rename)."""
    table_id = plan.handle.table.table_id if plan.handle is not None else None
    return lake.spec(plan.directory, columns, plan.schema.name.schema, table_id)


def inline_limits(changes: Sequence[int], budget: int) -> list[int]:
    """For each table of a batch (by its number of changes), the most upserts it may inline.

    Inlining costs per row (each goes through the catalog's driver, about 6 µs) where a data file costs per
    table, so a batch inlines at most ``budget`` rows over all its tables. The tables with the fewest changes come
    first: each may inline what the ones before it left of the budget, counted by their changes (which
    bound their upserts). A batch with many tables and many rows writes the larger tables' rows as files,
    which is cheaper at that size, and still keeps its smallest tables out of tiny files.
    """
    limits = [0] * len(changes)
    for index in sorted(range(len(changes)), key=changes.__getitem__):
        limits[index] = budget
        budget = max(0, budget - changes[index])
    return limits


def plan_changes(lake: Lake, segment: TableChanges, inline_limit: int, state: TableState) -> TablePlan | None:
    """The plan for one table's changes, or ``None`` when all of them were applied before. Its upserts are
    inlined when there are at most ``inline_limit`` of them (when Spark collapses them: at most that many
    changes), else all of them go to data files. ``state`` is the table's catalog state (``read_states``)."""
    schema = segment.schema
    handle = _handle(schema, state)
    changes = segment.table
    if handle is not None:
        changes = after(changes, handle.watermark)
    watermark = last_position(changes)
    if watermark is None:
        return _plan_schema(schema, state) if segment.table.num_rows == 0 else None
    change, new_ids, columns = _target_columns(schema, state)
    if watermark is not None and handle is not None and change:  # a chunk into the table as it is
        _check_not_inlined(handle.table, state.inlined_tables)
    directory = _directory(lake, schema, handle)
    plan = TablePlan(schema, handle, directory, change, new_ids, _sources(columns), watermark=watermark)
    plan.truncate, changes = after_last_truncate(changes)
    if changes.num_rows == 0:
        return plan
    _plan_rows(
        lake,
        plan,
        changes,
        columns=columns,
        inlined_tables=[] if plan.truncate else state.inlined_tables,
        data_files=[] if plan.truncate else state.data_files,
        key_bounds=state.bounds_of,
        inline_limit=inline_limit,
    )
    return plan


def _plan_rows(
    lake: Lake,
    plan: TablePlan,
    changes: pa.Table,
    *,
    columns: list[LakeColumn],
    inlined_tables: list[str],
    data_files: list[DataFile],
    key_bounds: Callable[[int], dict[int, tuple[int, int]]],
    inline_limit: int,
) -> None:
    """Plan the rows of ``changes`` (after the watermark and the last truncate): find the stored rows they
    replace or delete, and write or inline the rows they leave.

    pyspark is imported only where Spark works, once the session is asked for: its start imports pyspark on a thread
    of its own (``session.start_in_background``), and a second thread importing it at the same time can find it half
    initialized. A batch that needs no Spark imports none."""
    schema = plan.schema
    names = schema.column_names
    key = [c.name for c in schema.key_columns]
    only_inserts = bool(pc.all(pc.equal(changes[OP_COLUMN], "I")).as_py())
    toast = missing_columns(changes)
    needed = [c for c in columns if c.name in [*key, *toast]] if key else columns
    scan = bool(data_files) and not only_inserts
    inline = inlinable(columns)
    collapsed = last_change_per_key_arrow(changes, names, key, toast) if key else None
    if collapsed is not None and scan and len(key) == 1:  # files whose key bounds hold no touched key: skipped
        column = next(c for c in columns if c.name == key[0])
        data_files = may_hold(key_bounds(column.column_id), column, collapsed[key[0]], data_files)
    candidates = data_files if scan else []
    lookup = _driver_lookup(columns, key, candidates) if key else None
    if collapsed is not None and (not toast or (_driver_fill(columns, key) and (lookup is not None or not candidates))):
        # The common case. The batch is collapsed on the driver, in Arrow; the stored rows of its keys are found
        # on the driver (by the key columns' values, from the key cache) or by one Spark job (few keys next to
        # the table's, so broadcast into the scan), the positions already deleted are dropped on the driver, the
        # values an update left unchanged (TOAST) are read from the rows found, and the upserts are inlined or
        # written as files, on the driver.
        found = None
        if lookup is not None:
            found = lake.storage.positions_of_keys(lookup, candidates, collapsed[key[0]].combine_chunks())
            plan.deletes = file_positions(found, candidates, lake.storage)
        elif candidates:
            frame = lake.to_spark(collapsed.select(key), columns)
            from pyspark.sql import functions as sf

            touched = sf.broadcast(frame)
            stored = read_rows(lake.spark, lake.storage, needed, [f.path for f in candidates]).join(
                touched, key, "inner"
            )
            plan.deletes = matched_positions(stored, candidates, lake.storage)
        inlined_rows = None
        if inlined_tables and not only_inserts:
            wanted = _integer_key(columns, key, collapsed)  # then only the inlined rows of touched keys are read
            inlined_rows = lake.catalog.inlined_rows(inlined_tables, needed, Form.SPARK, keys=wanted)
            plan.ended_inlined = _inlined_of_keys(inlined_rows, collapsed.select(key), columns)
        upserts = collapsed.filter(pc.equal(collapsed[ACTION], UPSERT))
        key_column = next(c for c in columns if c.name == key[0])
        if toast:
            stored_values = StoredValues(lake.storage, candidates, found, inlined_rows)
            upserts = stored_values.fill(upserts, key_column, columns, toast)
        upserts = upserts.select(names)
        _place_rows(lake, plan, columns, upserts, inline and upserts.num_rows <= inline_limit)
        if plan.files and len(key) == 1 and searchable(key_column):
            plan.written_keys = (key_column.column_id, upserts[key[0]])
        return
    if not key and only_inserts:
        # An append-only table without a key (a log, a history): each insert is one more copy of its row, and
        # no stored row changes, so the rows are written as they came, on the driver.
        _place_rows(lake, plan, columns, changes.select(names), inline and changes.num_rows <= inline_limit)
        return
    # Unchanged TOAST values of a key the driver cannot search (or of more candidate rows than it searches,
    # ``DRIVER_LOOKUP_ROWS``), or no key: stored rows joined in Spark.
    inlined_rows = None
    if inlined_tables and not only_inserts:
        inlined_rows = lake.catalog.inlined_rows(inlined_tables, needed, Form.SPARK)
    has_inlined = inlined_rows is not None and inlined_rows.num_rows > 0
    live = live_rows(lake, needed, data_files, inlined_rows if has_inlined else None) if scan or has_inlined else None
    from pyspark.sql import functions as sf

    if collapsed is not None:
        frame = lake.to_spark(collapsed, columns).cache()
        upserts = frame.filter(frame[ACTION] == UPSERT)
        if live is not None:
            upserts = fill_from_lake(upserts, live, key, toast)
            touched = sf.broadcast(frame.select(*key))
            plan.deletes, plan.ended_inlined = matched_positions_and_inlined(
                live.join(touched, key, "inner"), data_files, lake.storage
            )
        rows = upserts.select(*names)
    else:
        frame = net_changes_without_key(lake.to_spark(changes, columns), names).cache()
        if live is not None:
            plan.deletes, plan.ended_inlined = matched_positions_and_inlined(
                occurrences(live, frame, names), data_files, lake.storage
            )
        if not only_inserts:
            _check_removed(plan, removed_copies(frame))
        rows = copies(frame, names)
    try:
        if inline and changes.num_rows <= inline_limit:  # no more rows than changes
            inlined_upserts = rows.toArrow()
            plan.inline = inlined_upserts if inlined_upserts.num_rows else None
        else:
            plan.files = lake.storage.write_frame(rows, _spec(lake, plan, columns))
    finally:
        frame.unpersist()


def _driver_fill(columns: Sequence[LakeColumn], key: list[str]) -> bool:
    """Whether the values an update left unchanged are filled on the driver: a key of one integer or text column,
    whose stored rows the driver finds by value (``StoredValues``)."""
    return len(key) == 1 and searchable(next(c for c in columns if c.name == key[0]))


def _place_rows(lake: Lake, plan: TablePlan, columns: list[LakeColumn], rows: pa.Table, inlined: bool) -> None:
    """Inline ``rows`` into the catalog when ``inlined``, else write them as data files on the driver."""
    if not rows.num_rows:
        return
    if inlined:
        plan.inline = rows
    else:
        plan.files = lake.storage.write_rows(_spec(lake, plan, columns), rows)


def _check_removed(plan: TablePlan, removes: int) -> None:
    """Say when the deletes of a table without a key found fewer stored copies of their rows than they remove: the
    lake lacked rows the source held (written around the pipeline, or lost), and still differs from it."""
    found = sum(len(positions) for _, positions in plan.deletes.values()) + len(plan.ended_inlined)
    if found < removes:
        log.warning(
            "deletes found fewer stored rows than they remove: the lake lacked rows the source held",
            table=str(plan.schema.name),
            removes=removes,
            found=found,
            hint=f"copy the table again to mend it: etl resync -c <pipeline file> --table {plan.schema.name}",
        )


DRIVER_LOOKUP_ROWS = 20_000_000
"""Candidate files holding up to this many rows (a key column of a few hundred MB at most) are searched for a
batch's keys on the driver, with pyarrow; more go to a Spark job."""


def _driver_lookup(columns: Sequence[LakeColumn], key: list[str], candidates: list[DataFile]) -> LakeColumn | None:
    """The key column to search the candidate files for on the driver, when that is the cheaper way: a
    one-column integer or text key, and few candidate rows. A Spark job costs about a second whatever its size."""
    if len(key) != 1 or not candidates or sum(f.record_count for f in candidates) > DRIVER_LOOKUP_ROWS:
        return None
    column = next(c for c in columns if c.name == key[0])
    return column if searchable(column) else None


def searchable(column: LakeColumn) -> bool:
    """Whether files are searched for values of this key column on the driver: integers and text."""
    return column.type.startswith("int") or column.type == "varchar"


def _check_not_inlined(table: LakeTable, inlined_tables: list[str]) -> None:
    """Columns change: flush the table's inlined rows first, when it has some (``inlined_tables`` hold rows)."""
    if inlined_tables:
        raise FlushFirst(table)


def _integer_key(columns: Sequence[LakeColumn], key: list[str], collapsed: pa.Table) -> tuple[str, list[int]] | None:
    """A one-column integer key's name and the batch's values of it; ``None`` for other keys."""
    if len(key) != 1 or not next(c for c in columns if c.name == key[0]).type.startswith("int"):
        return None
    return key[0], pc.unique(collapsed[key[0]].drop_null()).to_pylist()


def _inlined_of_keys(inlined_rows: pa.Table, keys: pa.Table, columns: Sequence[LakeColumn]) -> list[int]:
    """Row ids of the live inlined rows (key columns in their Spark form) whose key is one of ``keys``."""
    if inlined_rows.num_rows == 0:
        return []
    by_name = {c.name: c for c in columns}
    wanted = pa.table({k: convert(keys[k], by_name[k], Form.SPARK) for k in keys.column_names})
    matched = inlined_rows.select(["row_id", *keys.column_names]).join(wanted, keys.column_names, join_type="inner")
    return sorted(set(matched["row_id"].to_pylist()))


def _plan_schema(schema: TableSchema, state: TableState) -> TablePlan | None:
    """A schema version with no change of its own in the batch (the DDL trigger reports it at the DDL).

    It is applied when it is newer than every change the table holds (its commit LSN is past the
    watermark), and moves the watermark to just before that transaction's first change. So a replay of
    it, or of any older version, is skipped and cannot roll the lake's schema back. A version made in a
    transaction that changed the table before the DDL is not newer; it arrives with the next change.
    """
    lsn, handle = int(schema.snapshot_lsn), state.handle
    if handle is None or lsn <= handle.watermark[0]:
        return None
    change, new_ids, columns = _target_columns(schema, state)
    if not change and not _renamed(handle.table, schema):
        return None
    if change:
        _check_not_inlined(handle.table, state.inlined_tables)
    return TablePlan(
        schema, handle, handle.table.directory, change, new_ids, _sources(columns), watermark=(lsn, BEFORE_FIRST)
    )
