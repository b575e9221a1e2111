"""The ``etl`` command line: run, check, status, resync, plugins, demo."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

import structlog

from etl import __version__
from etl.config import PipelineConfig, load_config
from etl.errors import EtlError
from etl.log import configure_logging
from etl.plugins import load_registry
from etl.postgres.ddl import install_sql, uninstall_sql

if TYPE_CHECKING:
    from etl.pipeline import Pipeline

log = structlog.get_logger(__name__)


def echo(text: str = "") -> None:
    """Command output (not logging) goes to stdout."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


CONFIG_VARIABLE = "ETL_CONFIG"
"""The environment variable naming the pipeline file when ``-c`` is not given."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etl", description="Change data capture from PostgreSQL.")
    parser.add_argument("--version", action="version", version=f"etl {__version__}")
    parser.add_argument(
        "--log-format",
        choices=["console", "json"],
        default="console",
        help="log lines on stderr: readable (console, the default) or one JSON object per line (json)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the least severe log lines shown (default: info)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        default = os.environ.get(CONFIG_VARIABLE) or None
        sub.add_argument(
            "-c",
            "--config",
            required=default is None,
            default=default,
            metavar="FILE",
            help=f"pipeline file (TOML); default: ${CONFIG_VARIABLE}",
        )
        return sub

    with_config("run", "run a pipeline until interrupted (SIGINT/SIGTERM drain and stop it)")
    check = with_config("check", "check that the source is ready for the pipeline")
    check.add_argument("--format", choices=["text", "json"], default="text", help="output format (default: text)")
    check.add_argument(
        "--deep",
        action="store_true",
        help="also run what the run runs: start the destination's Spark session and run a job, write a probe where"
        " data goes",
    )
    status = with_config("status", "print table states, progress and replication slot lag")
    status.add_argument("--format", choices=["text", "json"], default="text", help="output format (default: text)")
    status.add_argument(
        "--watch",
        action="store_true",
        help="a live view in the terminal, refreshed until Ctrl-C (needs a durable store)",
    )
    status.add_argument(
        "--interval",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between two refreshes of --watch (default: 2)",
    )
    resync = with_config("resync", "copy one table again while the others keep streaming")
    resync.add_argument("--table", required=True, metavar="SCHEMA.NAME", help="the published table to copy again")
    resync.add_argument(
        "--where",
        metavar="PREDICATE",
        help='copy only the rows this SQL condition picks ("id > 1000"), upserted into the table as it is'
        " (a backfill, in key-ordered chunks; the table needs a primary key or replica identity index)",
    )
    reset = with_config(
        "reset", "drop the pipeline's replication slots and copy every table again at the next run (pipeline stopped)"
    )
    reset.add_argument(
        "--recopy", action="store_true", required=True, help="say that every table is to be copied again"
    )
    commands.add_parser(
        "plugins",
        help="list installed destinations and stores",
        description="List the installed destinations and stores: each plugin's name, kind, package and version.",
    )
    trigger = commands.add_parser(
        "ddl-trigger",
        help="print the SQL that installs (or removes) the schema change trigger, for a superuser to run",
        description="Print the SQL that installs the schema change trigger (an event trigger that tells the"
        " pipeline of nullability, defaults and renames) on the source database, for a superuser to run on the"
        " primary: etl ddl-trigger --print-sql | psql -d <source database>. A pipeline whose role is a superuser"
        " installs it itself.",
    )
    action = trigger.add_mutually_exclusive_group(required=True)
    action.add_argument("--print-sql", action="store_true", help="print the install SQL (idempotent: it updates)")
    action.add_argument("--print-uninstall-sql", action="store_true", help="print the SQL that removes it")
    demo = commands.add_parser(
        "demo",
        help="stream a throwaway Postgres into a destination and print the tables as it reads them",
        description="Stream a throwaway Postgres into a local DuckLake lake (SQLite store) when etl-spark and"
        " etl-store-sqlite are installed, else into memory, and print the tables as the destination reads them.",
    )
    demo.add_argument("--rows", type=int, default=1000, help="rows in the sample orders table")
    demo.add_argument(
        "--dir", type=Path, metavar="DIR", help="keep the lake and the store in DIR (default: a temporary directory)"
    )
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    try:
        if args.command == "plugins":
            return cmd_plugins()
        if args.command == "ddl-trigger":
            sys.stdout.write(install_sql() if args.print_sql else uninstall_sql())
            return 0
        if args.command == "demo":
            from etl.demo import run_demo

            return run_demo(rows=args.rows, out=echo, directory=args.dir)
        config = load_config(args.config)
        if args.command == "run":
            return cmd_run(config, args.config)
        if args.command == "check":
            return cmd_check(config, args.config, args.format, deep=args.deep)
        if args.command == "status":
            return cmd_status(config, args.config, args.format, watch=args.watch, interval=args.interval)
        if args.command == "resync":
            return cmd_resync(config, args.config, args.table, args.where)
        if args.command == "reset":
            return cmd_reset(config, args.config)
    except EtlError as exc:
        log.error(exc.message, hint=exc.hint)
        return 1
    except KeyboardInterrupt:
        return 130
    raise AssertionError(args.command)


def cmd_plugins() -> int:
    registry = load_registry()
    rows = [(p.name, p.kind, p.distribution, p.version) for p in registry.all()]
    _table(["name", "kind", "distribution", "version"], rows)
    for broken in registry.broken:
        echo(f"BROKEN  {broken.entry_point} from {broken.distribution}: {broken.error}")
    return 1 if registry.broken else 0


EXIT_UNDRAINED = 3
"""``etl run`` stopped without a clean drain: ``[pipeline] shutdown_timeout_s`` passed, or a second signal came.
Durable progress is kept (delivery is at-least-once), so the next run resumes from it."""


def cmd_run(config: PipelineConfig, path: str) -> int:
    """Run until SIGINT/SIGTERM, then drain; exit 0 after a clean stop, ``EXIT_UNDRAINED`` when the drain
    does not end within ``shutdown_timeout_s`` (or on a second signal)."""
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, _stop_before_start) for sig in signals}
    try:
        try:
            log.info("etl run starting", pipeline_id=config.pipeline.id, config=path)
            from etl.factory import build_destination, build_store
            from etl.pipeline import Pipeline

            store = build_store(config, path)
            destination = build_destination(config, store, path)
            pipeline = Pipeline(config, store, destination)
            bound = _BoundedStop(pipeline, config.pipeline.shutdown_timeout_s)
            for sig in signals:
                signal.signal(sig, bound.on_signal)
        except _StoppedBeforeStart as stopped:
            log.info("stopped before the pipeline started: nothing to drain", signal=stopped.signal.name)
            return 0
        try:
            pipeline.start()  # a signal during the start is honoured: the pipeline stops as soon as it runs
            try:
                while not pipeline.wait(timeout=0.5):
                    pass
            finally:
                bound.begin()  # the pipeline also ends on its own (an error): its shutdown is bounded the same way
                if not pipeline.shutdown(timeout=bound.remaining()):
                    bound.exit_undrained()
            return 0
        finally:
            bound.finish()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _StoppedBeforeStart(BaseException):  # not an Exception: no handler of the build may take it for an error
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal = signal.Signals(signum)


def _stop_before_start(signum: int, _frame: FrameType | None) -> NoReturn:
    """SIGINT or SIGTERM while ``etl run`` builds its store and destination (a store's server that does not
    answer can hold it there for a while): it stops at once, as a clean stop, before anything was started."""
    raise _StoppedBeforeStart(signum)


class _BoundedStop:
    """Bounds the stop of ``etl run``: ``timeout`` seconds from the first signal (or from the pipeline's own
    end) to a clean drain, else an exit with ``EXIT_UNDRAINED``; a second signal exits at once.

    The exit is ``os._exit``: threads blocked in I/O on a frozen server (a ``ThreadPoolExecutor``'s among
    them, which Python joins at exit) would otherwise keep the process alive. A watchdog thread exits even
    when the main thread itself is blocked (closing a destination, say). The signal handler only sets events:
    it runs between two bytecodes of the main thread, which may be holding a lock (a log write's).
    """

    def __init__(self, pipeline: Pipeline, timeout: float) -> None:
        self.pipeline = pipeline
        self.timeout = timeout
        self.signal: signal.Signals | None = None
        self._deadline: float | None = None
        self._begun = threading.Event()
        self._second_signal = threading.Event()
        self._lock = threading.Lock()
        self._finished = False
        threading.Thread(target=self._watch, name="etl-shutdown-watchdog", daemon=True).start()

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal is not None:
            self._second_signal.set()
            return
        self.signal = signal.Signals(signum)
        self.pipeline.request_stop()
        self.begin()

    def begin(self) -> None:
        if self._deadline is None:
            self._deadline = time.monotonic() + self.timeout
        self._begun.set()

    def remaining(self) -> float:
        return max(0.0, (self._deadline or time.monotonic()) - time.monotonic())

    def finish(self) -> None:
        """The run is over (cleanly or by an error it reports itself): the watchdog must not exit any more."""
        with self._lock:
            self._finished = True

    def exit_undrained(self, why: str | None = None) -> NoReturn:
        with self._lock:  # held until the exit: finish() cannot slip in between
            log.error(
                "exiting without a clean drain: " + (why or f"the pipeline did not stop within {self.timeout:g}s"),
                exit_code=EXIT_UNDRAINED,
                progress="durable progress is kept; delivery is at-least-once, so the next run resumes from it"
                " (changes after it may be delivered again)",
                busy=sorted(t.name for t in threading.enumerate() if t is not threading.current_thread()),
                hint="the threads still busy are listed: an unresponsive source or destination is the usual cause;"
                " raise [pipeline] shutdown_timeout_s if clean drains need longer",
            )
            for stream in (sys.stderr, sys.stdout):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(EXIT_UNDRAINED)

    def _watch(self) -> None:
        self._begun.wait()
        if self.signal is not None:
            log.info("stopping: draining the batch in flight", signal=self.signal.name, timeout_s=self.timeout)
        second = self._second_signal.wait(self.remaining())
        with self._lock:
            if self._finished:
                return
        self.exit_undrained("a second signal came" if second else None)


def cmd_check(config: PipelineConfig, path: str, output: str = "text", *, deep: bool = False) -> int:
    from etl.checks import run_checks

    checks = run_checks(config, path, deep=deep)
    failed = sum(c.failed for c in checks)
    if output == "json":
        from etl.status import check_report

        echo(json.dumps(check_report(checks), indent=2))
        return 1 if failed else 0
    for check in checks:
        echo(check.line())
    echo(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


def cmd_status(
    config: PipelineConfig, path: str, output: str = "text", *, watch: bool = False, interval: float = 2.0
) -> int:
    """Print the pipeline's status as text or JSON, or show it live (``watch``) until Ctrl-C.

    Exits 1 when the report holds a problem (a lost apply slot); the live view exits 0 on Ctrl-C.
    """
    from dataclasses import replace

    from etl.factory import build_store
    from etl.status import MEMORY_STORE_NOTE, status_report, text_lines, watch_status

    if watch:
        if output != "text":
            raise EtlError(
                "etl status --watch shows a live view for people; it has no JSON form",
                hint="leave out --watch to print the status as JSON once (run it again to follow it)",
            )
        if config.store.type == "memory":
            raise EtlError(
                "etl status --watch needs a durable store: the memory store keeps table states inside the"
                " process of `etl run`, where no other process can read them",
                hint='use a durable store ([store] type = "sqlite" or "postgres"), or watch the pipeline\'s'
                " logs and metrics instead",
            )
        try:
            watch_status(config, lambda: build_store(config, path), interval=interval, config_path=path)
        except KeyboardInterrupt:
            return 0
        raise AssertionError("watch_status returns only by Ctrl-C")
    store = build_store(config, path)
    try:
        report = status_report(config, store, config_path=path)
    finally:
        store.close()
    if not report.durable_store:  # a store of its own, empty: the pipeline's state is in the pipeline's process
        report = replace(report, notes=(*report.notes, MEMORY_STORE_NOTE))
    if output == "json":
        echo(json.dumps(report.to_json(), indent=2))
        return 1 if report.problems else 0
    heading, tables, slots, problems = text_lines(report)
    for line in heading:
        echo(line)
    _table(["table", "state", "sync progress", "copy", "changes since start", "last write"], tables)
    _table(["slot", "active", "confirmed flush", "wal status", "lag"], slots)
    for problem in problems:
        echo(f"PROBLEM: {problem}")
    return 1 if problems else 0


def cmd_resync(config: PipelineConfig, path: str, table: str, where: str | None) -> int:
    """Ask the pipeline, through its store, to copy one table again or backfill it (as ``pipeline.request_resync``
    does, with the table and predicate checked before the store is opened: a wrong one leaves no store behind)."""
    from etl.factory import build_store
    from etl.pipeline import published_table_id
    from etl.schema import TableName

    if config.store.type == "memory":
        raise EtlError(
            "the memory store lives inside the running pipeline's process; `etl resync` cannot reach it",
            hint="restart the pipeline (a memory store copies every table at each start), or use a durable store"
            ' ([store] type = "sqlite" or "postgres")',
        )
    wanted = TableName.parse(table)
    table_id = published_table_id(config, wanted, where)
    store = build_store(config, path)
    try:
        store.request_resync(table_id, where)
    finally:
        store.close()
    later = "the running pipeline begins it within seconds, a stopped one at its start"
    if where is None:
        echo(f"resync of {wanted} requested; {later}")
    else:
        echo(f"backfill of {wanted} requested (rows where {where}); {later}")
    return 0


def cmd_reset(config: PipelineConfig, path: str) -> int:
    """Drop the pipeline's slots and set every table back to Init: the way out of a slot that cannot go on."""
    from etl.factory import build_store
    from etl.pipeline import reset_for_recopy

    store = build_store(config, path)
    try:
        store.acquire_lock()
        slots, tables = reset_for_recopy(config, store)
    finally:
        store.close()
    echo(f"dropped slots: {', '.join(slots) if slots else 'none'}")
    echo(f"{tables} tables are copied again when the pipeline next runs")
    return 0


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        echo("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
