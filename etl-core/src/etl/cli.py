"""The ``etl`` command line: run, check, status, resync, plugins, demo."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

import structlog

from etl import __version__
from etl.config import PipelineConfig, load_config
from etl.errors import EtlError
from etl.log import configure_logging
from etl.plugins import load_registry

log = structlog.get_logger(__name__)


def echo(text: str = "") -> None:
    """Command output (not logging) goes to stdout."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="etl", description="Change data capture from PostgreSQL.")
    parser.add_argument("--version", action="version", version=f"etl {__version__}")
    parser.add_argument("--log-format", choices=["console", "json"], default="console", help="log line format")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("-c", "--config", required=True, metavar="FILE", help="pipeline file (TOML)")
        return sub

    with_config("run", "run a pipeline until interrupted (SIGINT/SIGTERM drain and stop it)")
    with_config("check", "check that the source is ready for the pipeline")
    with_config("status", "print table states, progress and replication slot lag")
    resync = with_config("resync", "copy one table again while the others keep streaming")
    resync.add_argument("--table", required=True, metavar="SCHEMA.NAME", help="the published table to copy again")
    commands.add_parser("plugins", help="list installed destinations and stores")
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


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_format, args.log_level)
    try:
        if args.command == "plugins":
            return cmd_plugins()
        if args.command == "demo":
            from etl.demo import run_demo

            return run_demo(rows=args.rows, out=echo, directory=args.dir)
        config = load_config(args.config)
        if args.command == "run":
            return cmd_run(config, args.config)
        if args.command == "check":
            return cmd_check(config)
        if args.command == "status":
            return cmd_status(config, args.config)
        if args.command == "resync":
            return cmd_resync(config, args.table)
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


def cmd_run(config: PipelineConfig, path: str) -> int:
    from etl.factory import build_destination, build_store
    from etl.pipeline import Pipeline

    store = build_store(config, path)
    destination = build_destination(config, store, path)
    pipeline = Pipeline(config, store, destination)
    pipeline.start()

    def stop(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping: draining the batch in flight", signal=signal.Signals(signum).name)
        pipeline.request_stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not pipeline.wait(timeout=0.5):
            pass
    finally:
        pipeline.shutdown()
    return 0


def cmd_check(config: PipelineConfig) -> int:
    from etl.postgres.checks import run_checks

    checks = run_checks(config)
    for check in checks:
        echo(check.line())
    failed = sum(c.failed for c in checks)
    echo(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


def cmd_status(config: PipelineConfig, path: str) -> int:
    from etl.factory import build_store
    from etl.postgres.connection import connect
    from etl.replication.slots import slot_prefix
    from etl.store.base import APPLY_WORKER, table_sync_worker

    store = build_store(config, path)
    try:
        states = store.get_table_states()
        names = {s.id: str(s.name) for s in store.get_table_schemas()}
        echo(f"pipeline {config.pipeline.id} (store: {config.store.type})")
        progress = store.get_progress(APPLY_WORKER)
        echo(f"apply worker durable progress: {progress if progress is not None else 'none'}")
        rows = []
        for table_id, state in sorted(states.items(), key=lambda kv: names.get(kv[0], str(kv[0]))):
            sync = store.get_progress(table_sync_worker(table_id))
            rows.append((names.get(table_id, str(table_id)), str(state), str(sync) if sync is not None else ""))
        _table(["table", "state", "sync progress"], rows)
    finally:
        store.close()
    with connect(config.source) as conn:
        apply_prefix, sync_prefix = slot_prefix(config.pipeline.id)
        slots = conn.execute(
            "SELECT slot_name, active, confirmed_flush_lsn::text, wal_status,"
            " pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn))"
            " FROM pg_replication_slots WHERE slot_name = %s OR slot_name LIKE %s ORDER BY 1",
            (apply_prefix, sync_prefix + "%"),
        ).fetchall()
    _table(["slot", "active", "confirmed flush", "wal status", "lag"], [tuple(map(str, s)) for s in slots])
    return 0


def cmd_resync(config: PipelineConfig, table: str) -> int:
    """Ask the pipeline, through its own replication stream, to copy one table again.

    The request is a transactional logical message on the source, so the running pipeline acts on it
    at a precise point of the stream; a stopped pipeline acts on it when it next starts.
    """
    from etl.postgres.catalog import publication_tables
    from etl.postgres.connection import connect
    from etl.replication.apply import RESYNC_MESSAGE_PREFIX
    from etl.schema import TableName

    wanted = TableName.parse(table)
    with connect(config.source) as conn:
        published = {t.name: t for t in publication_tables(conn, config.pipeline.publication)}
        if wanted not in published:
            raise EtlError(
                f"table {wanted} is not in publication '{config.pipeline.publication}'",
                hint="published tables: " + ", ".join(sorted(str(n) for n in published)),
            )
        request = json.dumps({"pipeline_id": config.pipeline.id, "table_id": published[wanted].id})
        lsn = conn.execute(
            "SELECT pg_logical_emit_message(true, %s, %s)::text", (RESYNC_MESSAGE_PREFIX, request)
        ).fetchone()
    echo(f"resync of {wanted} requested at {lsn[0] if lsn else '?'}; the pipeline copies it again when it gets there")
    return 0


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        echo("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())


if __name__ == "__main__":
    sys.exit(main())
