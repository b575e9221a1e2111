"""The status of a pipeline as data: table states, copy progress, replication slots, problems.

``status_report(config, store)`` reads a store instance (reading does not take the pipeline lock, so it
works next to a running ``etl run``) and the source's replication slots, and returns a ``StatusReport``
whose ``to_json()`` is plain JSON values. ``etl status`` renders it as text, as JSON (``--format json``)
or as a live terminal view (``--watch``, ``watch_status``); a program that embeds a pipeline can call it
directly. ``check_report`` is the JSON form of the checks of ``etl check``.

A store instance answers from what it loaded when it opened: to see a running pipeline move, open a new
instance for each report (``watch_status`` does).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg

from etl.config import PipelineConfig
from etl.destination.base import DestinationPosition, PositionedDestination
from etl.errors import EtlError
from etl.factory import validate_plugin
from etl.lsn import Lsn
from etl.pipeline import apply_slot_lost, slot_lost_error
from etl.plugins import Registry, load_registry
from etl.postgres.catalog import WAL_POSITION
from etl.postgres.connection import connect
from etl.postgres.key_order import snapshot_copy_reason
from etl.postgres.slot_state import SlotState, slot_state
from etl.replication.incremental import ChunkMark
from etl.replication.slots import apply_slot, slot_prefix
from etl.schema import TableId, TableName
from etl.store.base import (
    APPLY_WORKER,
    CopyProgress,
    Store,
    TableActivity,
    TableState,
    TableStateKind,
    table_sync_worker,
)
from etl.store.codec import activity_to_obj
from etl.store.memory import MemoryStore

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from etl.preflight import Check

MEMORY_STORE_NOTE = (
    "the memory store keeps table states inside the process of `etl run`, so a status from another process"
    ' cannot show them: status needs a durable store ([store] type = "sqlite" or "postgres")'
)
"""What ``etl status`` adds to the notes of a report read from a memory store of its own."""


@dataclass(frozen=True)
class TableStatus:
    id: TableId
    name: str | None
    """``str(TableName)``; ``None`` when neither the store nor the source knows the table's name any more."""
    state: TableState
    sync_progress: Lsn | None
    """Durable progress of the table's sync worker (its catch-up), while it has one."""
    copy: CopyProgress | None
    """The table's copy: the one running, or the last one."""
    activity: TableActivity | None = None
    """What the pipeline's run wrote into the table (``Store.record_table_activity``)."""

    @property
    def label(self) -> str:
        return self.name if self.name is not None else str(self.id)

    def to_json(self) -> dict[str, Any]:
        state = self.state
        errored = state.kind is TableStateKind.ERRORED
        return {
            "name": self.name,
            "oid": self.id,
            "state": state.kind.value,
            "lsn": _lsn(state.lsn),
            "reason": state.reason if errored else None,
            "hint": state.hint if errored else None,
            "retry": state.retry.value if errored else None,
            "retry_at": state.retry_at.isoformat() if errored and state.retry_at is not None else None,
            "sync_progress": _lsn(self.sync_progress),
            "copy": None if self.copy is None else copy_to_json(self.copy),
            "activity": None if self.activity is None else activity_to_obj(self.activity),
        }


@dataclass(frozen=True)
class SlotStatus:
    name: str
    active: bool
    confirmed_flush: Lsn | None
    wal_status: str | None
    """``reserved``, ``extended``, ``unreserved`` or ``lost`` (``pg_replication_slots.wal_status``)."""
    lag_bytes: int | None
    """WAL between the source's current position and what the slot's consumer confirmed."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "active": self.active,
            "confirmed_flush": _lsn(self.confirmed_flush),
            "wal_status": self.wal_status,
            "lag_bytes": self.lag_bytes,
        }


@dataclass(frozen=True)
class DestinationStatus:
    """The position the destination recorded for the pipeline (``PositionedDestination``)."""

    type: str
    position: DestinationPosition | None
    """``None`` before the pipeline's first batch, or when it could not be read (``error``)."""
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        position = self.position
        return {
            "type": self.type,
            "lsn": None if position is None else str(position.lsn),
            "detail": None if position is None else position.detail,
            "error": self.error,
        }

    def line(self) -> str:
        if self.error is not None:
            return f"destination position: unknown ({self.error})"
        if self.position is None:
            return "destination position: none recorded yet"
        return f"destination position: {self.position.lsn} ({self.position.detail})"


@dataclass(frozen=True)
class Problem:
    """Something that stops the pipeline or loses data unless someone acts (``etl status`` exits 1)."""

    kind: str
    message: str
    hint: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "hint": self.hint}


@dataclass(frozen=True)
class StatusReport:
    pipeline_id: int
    publication: str
    store_type: str
    durable_store: bool
    """False for the memory store: its state lives and dies with one process."""
    apply_progress: Lsn | None
    """The apply worker's durable progress."""
    tables: tuple[TableStatus, ...]
    slots: tuple[SlotStatus, ...]
    problems: tuple[Problem, ...]
    generated_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    notes: tuple[str, ...] = ()
    """Remarks for the reader that are not problems."""
    destination: DestinationStatus | None = None
    """Where the destination says it stands; ``None`` for a destination that records no position."""

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline_id": self.pipeline_id,
            "publication": self.publication,
            "store": {"type": self.store_type, "durable": self.durable_store},
            "generated_at": self.generated_at.isoformat(),
            "apply_durable_progress": _lsn(self.apply_progress),
            "tables": [t.to_json() for t in self.tables],
            "slots": [s.to_json() for s in self.slots],
            "problems": [p.to_json() for p in self.problems],
            "notes": list(self.notes),
            "destination": None if self.destination is None else self.destination.to_json(),
        }


def activity_summary(activity: TableActivity) -> str:
    """The changes written since the run began, as ``12 ins, 3 upd, 1 del`` (truncates only when there were)."""
    parts = [f"{activity.inserts:,} ins", f"{activity.updates:,} upd", f"{activity.deletes:,} del"]
    if activity.truncates:
        parts.append(f"{activity.truncates:,} trunc")
    return ", ".join(parts)


def last_write(activity: TableActivity, now: datetime | None = None) -> str:
    """When the table's last batch was durable: ``02:53:09 UTC (5s ago)``, the date too when not today."""
    at, now = activity.last_write_at, now or datetime.now(UTC)
    shown = f"{at:%H:%M:%S} UTC" if at.date() == now.date() else f"{at:%Y-%m-%d %H:%M:%S} UTC"
    return f"{shown} ({duration(max(0.0, (now - at).total_seconds()))} ago)"


def copy_to_json(progress: CopyProgress) -> dict[str, Any]:
    fraction, eta = progress.fraction, progress.eta_seconds
    return {
        "rows": progress.rows,
        "estimate": progress.estimate,
        "percent": None if fraction is None else round(100 * fraction, 1),
        "rows_per_s": round(progress.rate, 1),
        "eta_s": None if eta is None else round(eta, 1),
        "elapsed_s": round(progress.seconds, 3),
        "started_at": progress.started_at.isoformat(),
        "recorded_at": progress.recorded_at.isoformat(),
        "finished": progress.finished,
        "note": copy_note(progress),
    }


def copy_note(progress: CopyProgress) -> str | None:
    """What an incremental copy waits for, or what became of it (``Recorded.note``); ``None``: nothing to say."""
    return None if progress.resume_after is None else ChunkMark.from_json(progress.resume_after).note


def status_report(
    config: PipelineConfig, store: Store, *, config_path: str | None = None, registry: Registry | None = None
) -> StatusReport:
    """The pipeline's status from ``store``, from the source's replication slots, and from the destination's own
    record of its position when its plugin keeps one (``PositionedDestination``; plugins from ``registry``, by
    default the installed ones).

    ``config_path`` names the pipeline file in hints. Raises ``EtlError`` when the source cannot be reached.
    """
    states = store.get_table_states()
    names = {s.id: str(s.name) for s in store.get_table_schemas()}
    apply_progress = store.get_progress(APPLY_WORKER)
    activity = store.get_table_activity()
    found = {
        table_id: (
            state,
            store.get_progress(table_sync_worker(table_id)),
            store.get_copy_progress(table_id),
            activity.get(table_id),
        )
        for table_id, state in states.items()
    }
    apply_name, sync_prefix = slot_prefix(config.pipeline.id)
    with connect(config.source) as conn:
        rows = conn.execute(
            "SELECT slot_name, active, confirmed_flush_lsn::text, wal_status,"
            f" pg_wal_lsn_diff({WAL_POSITION}, confirmed_flush_lsn)::bigint"
            " FROM pg_catalog.pg_replication_slots WHERE slot_name = %s OR starts_with(slot_name, %s) ORDER BY 1",
            (apply_name, sync_prefix),
        ).fetchall()
        apply_state = slot_state(conn, apply_name)
        unnamed = [table_id for table_id in states if table_id not in names]  # not copied yet: no schema stored
        if unnamed:
            for oid, schema, name in conn.execute(
                "SELECT c.oid::bigint, n.nspname, c.relname FROM pg_catalog.pg_class c"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY(%s::bigint[]::oid[])",
                (unnamed,),
            ):
                names[oid] = str(TableName(schema, name))
        by_snapshot = _snapshot_copies(conn, config, states, names)
    slots = tuple(
        SlotStatus(
            name=str(name),
            active=bool(active),
            confirmed_flush=None if flush is None else Lsn.parse(flush),
            wal_status=wal_status,
            lag_bytes=None if lag is None else int(lag),
        )
        for name, active, flush, wal_status, lag in rows
    )
    tables = tuple(
        sorted(
            (TableStatus(table_id, names.get(table_id), *found[table_id]) for table_id in states),
            key=lambda t: (t.name is None, t.label, t.id),
        )
    )
    destination = destination_status(config, config_path or "the pipeline file", registry)
    problems = _problems(config, apply_state, store, config_path)
    problems += _destination_behind(destination, apply_progress, config_path)
    return StatusReport(
        pipeline_id=config.pipeline.id,
        publication=config.pipeline.publication,
        store_type=config.store.type,
        durable_store=not isinstance(store, MemoryStore),
        apply_progress=apply_progress,
        tables=tables,
        slots=slots,
        problems=tuple(problems),
        notes=by_snapshot,
        destination=destination,
    )


def destination_status(
    config: PipelineConfig, source: str, registry: Registry | None = None
) -> DestinationStatus | None:
    """The position the pipeline's destination recorded, when its plugin keeps one; a failure to read it is
    reported in the result, not raised (the rest of the status stands without it)."""
    try:
        cls, options = validate_plugin(registry or load_registry(), "destination", config.destination, source)
    except EtlError:
        return None  # etl check and etl run say what is wrong with the section
    if not isinstance(cls, PositionedDestination):
        return None
    try:
        return DestinationStatus(config.destination.type, cls.recorded_position(options, config.pipeline.id))
    except EtlError as exc:
        return DestinationStatus(config.destination.type, None, exc.message)
    except Exception as exc:  # a plugin's bug must not take the rest of the status with it; its text may hold secrets
        return DestinationStatus(
            config.destination.type, None, f"the destination plugin failed to read it ({type(exc).__name__})"
        )


def _destination_behind(
    destination: DestinationStatus | None, progress: Lsn | None, config_path: str | None
) -> list[Problem]:
    """The destination's position behind the store's progress: the start will fail on it."""
    position = None if destination is None else destination.position
    if position is None or progress is None or position.lsn >= progress:
        return []
    problem = Problem(
        "destination_behind",
        f"the destination stands at {position.lsn} ({position.detail}), behind {progress},"
        " which the store says the pipeline wrote into it: it is older than what the pipeline wrote (restored from a"
        " backup, say), and the pipeline will not start on it",
        "point the destination at the one the pipeline wrote; to copy every table again into this one, stop the"
        f" pipeline and run etl reset --recopy -c {config_path or '<pipeline file>'}",
    )
    return [problem]


def _snapshot_copies(
    conn: psycopg.Connection[Any],
    config: PipelineConfig,
    states: Mapping[TableId, TableState],
    names: Mapping[int, str],
) -> tuple[str, ...]:
    """With ``[copy] method = "incremental"``, the tables still to copy that get a snapshot copy instead, and why."""
    if config.copy_.method != "incremental":
        return ()
    waiting = [t for t, s in states.items() if s.kind in (TableStateKind.INIT, TableStateKind.DATA_SYNC)]
    return tuple(
        f"{names.get(t, t)} is copied by snapshot, not in chunks: {why}"
        for t in sorted(waiting, key=lambda t: names.get(t, str(t)))
        if (why := snapshot_copy_reason(conn, t))
    )


def _problems(config: PipelineConfig, apply_state: SlotState, store: Store, config_path: str | None) -> list[Problem]:
    if not apply_slot_lost(apply_state, store):
        return []
    slot = apply_slot(config.pipeline.id)
    error = slot_lost_error(slot, apply_state, config_path or "<pipeline file>")
    return [Problem("apply_slot_lost", error.message, error.hint or "")]


def check_report(checks: Sequence[Check]) -> dict[str, Any]:
    """The checks of ``etl check`` as plain JSON values: each check's verdict, message and fix, and the totals."""
    entries = [
        {
            "name": c.name,
            "passed": c.ok,
            "advisory": c.advisory,
            "verdict": "pass" if c.ok else "warn" if c.advisory else "fail",
            "message": c.detail,
            "hint": None if c.ok else c.fix,
        }
        for c in checks
    ]
    failed = sum(c.failed for c in checks)
    warned = sum(not c.ok and c.advisory for c in checks)
    return {
        "checks": entries,
        "totals": {"checks": len(checks), "passed": sum(c.ok for c in checks), "warned": warned, "failed": failed},
        "ok": failed == 0,
    }


# -- words for people ---------------------------------------------------------------------------------
def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h03m``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def size_pretty(size: int) -> str:
    """Bytes as ``pg_size_pretty`` words them: bytes below 10 kB, then the largest unit that stays below 10240."""
    if abs(size) < 10 * 1024:
        return f"{size} bytes"
    units = ("kB", "MB", "GB", "TB", "PB")
    for power, unit in enumerate(units, start=1):
        value = int(abs(size) / 1024**power + 0.5) * (1 if size >= 0 else -1)
        if abs(value) < 10 * 1024 or unit == units[-1]:
            return f"{value} {unit}"
    raise AssertionError("unreachable")


def copy_summary(progress: CopyProgress) -> str:
    """One line on a copy: ``1,200/10,000 rows (12.0%), 3,400 rows/s, 3s left`` while it runs, ``10,000 rows in 3s
    (3,300 rows/s)`` once finished."""
    rate, note = f"{progress.rate:,.0f} rows/s", copy_note(progress)
    said = "" if note is None else f"; {note}"
    if progress.finished:
        return f"{progress.rows:,} rows in {duration(progress.seconds)} ({rate}){said}"
    if progress.estimate is None:
        return f"{progress.rows:,} rows, {rate}{said}"
    fraction, eta = progress.fraction or 0.0, progress.eta_seconds
    left = "" if eta is None else f", {duration(eta)} left"
    return f"{progress.rows:,}/{progress.estimate:,} rows ({100 * fraction:.1f}%), {rate}{left}{said}"


def text_lines(report: StatusReport) -> tuple[list[str], list[list[str]], list[list[str]], list[str]]:
    """What ``etl status`` prints: the heading lines, the rows of the table list, the rows of the slot list, and
    the problems (each a sentence)."""
    heading = [
        f"pipeline {report.pipeline_id} (store: {report.store_type})",
        f"apply worker durable progress: {report.apply_progress if report.apply_progress is not None else 'none'}",
        *([report.destination.line()] if report.destination is not None else []),
        *(f"note: {note}" for note in report.notes),
    ]
    tables = [
        [
            t.label,
            str(t.state),
            str(t.sync_progress) if t.sync_progress is not None else "",
            copy_summary(t.copy) if t.copy is not None else "",
            activity_summary(t.activity) if t.activity is not None else "",
            last_write(t.activity, report.generated_at) if t.activity is not None else "",
        ]
        for t in report.tables
    ]
    slots = [
        [
            s.name,
            "yes" if s.active else "no",
            _text(s.confirmed_flush),
            _text(s.wal_status),
            size_pretty(s.lag_bytes) if s.lag_bytes is not None else "",
        ]
        for s in report.slots
    ]
    problems = [f"{p.message}. {p.hint[:1].upper()}{p.hint[1:]}" for p in report.problems]
    return heading, tables, slots, problems


# -- the live view ------------------------------------------------------------------------------------
STALE_AFTER_S = 60.0
"""A running copy reports every few seconds; the view says so when one has not reported for this long."""

_STATE_STYLES = {
    TableStateKind.READY: "green",
    TableStateKind.ERRORED: "bold red",
    TableStateKind.INIT: "dim",
    TableStateKind.DATA_SYNC: "yellow",
    TableStateKind.COPYING: "yellow",
}


def status_view(
    report: StatusReport | None, *, interval: float, error: EtlError | None = None, now: datetime | None = None
) -> RenderableType:
    """The live view of ``report`` (rich renderables): tables with copy progress bars, slots with lag, problems.

    ``error``: the last refresh failed (``report`` is then the last good one, if any).
    """
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    now = now or datetime.now(UTC)
    parts: list[RenderableType] = []
    if report is not None:
        progress = report.apply_progress
        parts.append(
            Text.assemble(
                (f"pipeline {report.pipeline_id}", "bold"),
                f"  publication {report.publication}  store {report.store_type}  apply durable progress ",
                (str(progress) if progress is not None else "none", "bold"),
            )
        )
        tables = Table(title="tables", title_justify="left", expand=False)
        for column in ("table", "state", "copy", "rows", "rows/s", "ETA", "sync progress", "changes", "last write"):
            tables.add_column(column, justify="right" if column in ("rows", "rows/s", "ETA") else "left")
        for t in report.tables:
            state = Text(str(t.state), style=_STATE_STYLES.get(t.state.kind, ""))
            copy, activity = t.copy, t.activity
            written = (activity_summary(activity), last_write(activity, now)) if activity is not None else ("", "")
            if copy is None:
                tables.add_row(t.label, state, "", "", "", "", _text(t.sync_progress), *written)
                continue
            fraction, eta = copy.fraction, copy.eta_seconds
            bar = ProgressBar(total=None if fraction is None else 1.0, completed=fraction or 0.0, width=30)
            rows = f"{copy.rows:,}" + ("" if copy.estimate is None or copy.finished else f" / {copy.estimate:,}")
            if fraction is not None:
                rows += f" ({100 * fraction:.1f}%)"
            if copy.finished:
                left = "done"
            else:
                left = "" if eta is None else duration(eta)
                copying = t.state.kind in (TableStateKind.DATA_SYNC, TableStateKind.COPYING)
                if copying and copy.age(now) > STALE_AFTER_S:
                    left += f" (no report for {duration(copy.age(now))}: is `etl run` running?)"
            note = copy_note(copy)
            left += "" if note is None else f" ({note})"
            tables.add_row(t.label, state, bar, rows, f"{copy.rate:,.0f}", left, _text(t.sync_progress), *written)
        if not report.tables:
            tables.add_row(Text("no tables yet", style="dim"), *[""] * 8)
        parts.append(tables)
        slots = Table(title="replication slots", title_justify="left")
        for column in ("slot", "active", "confirmed flush", "wal status", "lag"):
            slots.add_column(column, justify="right" if column == "lag" else "left")
        for s in report.slots:
            slots.add_row(
                s.name,
                Text("yes", style="green") if s.active else Text("no", style="yellow"),
                _text(s.confirmed_flush),
                Text(str(s.wal_status), style="bold red" if s.wal_status == "lost" else ""),
                "" if s.lag_bytes is None else size_pretty(s.lag_bytes),
            )
        if not report.slots:
            slots.add_row(Text("no slots", style="dim"), "", "", "", "")
        parts.append(slots)
        for problem in report.problems:
            parts.append(Text(f"PROBLEM: {problem.message}\n  hint: {problem.hint}", style="bold red"))
        for note in report.notes:
            parts.append(Text(f"note: {note}", style="yellow"))
    if error is not None:
        parts.append(
            Text(f"refresh failed: {error.message}" + (f"\n  hint: {error.hint}" if error.hint else ""), style="red")
        )
    when = f"{report.generated_at:%H:%M:%S} UTC" if report is not None else "never"
    parts.append(Text(f"updated {when}; refreshed every {interval:g}s; Ctrl-C to quit", style="dim"))
    return Group(*parts)


def watch_status(
    config: PipelineConfig,
    open_store: Callable[[], Store],
    *,
    interval: float = 2.0,
    config_path: str | None = None,
    console: Console | None = None,
) -> None:
    """Show the live view, refreshed every ``interval`` seconds from a store opened afresh each time, until
    ``KeyboardInterrupt`` (which the caller handles). A refresh that fails shows its error and the last report."""
    from rich.console import Console
    from rich.live import Live

    report: StatusReport | None = None
    with Live(console=console or Console(), auto_refresh=False) as live:
        while True:
            error: EtlError | None = None
            try:
                store = open_store()
                try:
                    report = status_report(config, store, config_path=config_path)
                finally:
                    store.close()
            except EtlError as exc:
                error = exc
            live.update(status_view(report, interval=interval, error=error), refresh=True)
            time.sleep(interval)


def _lsn(lsn: Lsn | None) -> str | None:
    return None if lsn is None else str(lsn)


def _text(value: object) -> str:
    return "" if value is None else str(value)


__all__ = [
    "Problem",
    "SlotStatus",
    "StatusReport",
    "TableStatus",
    "check_report",
    "copy_summary",
    "status_report",
    "status_view",
    "watch_status",
]
