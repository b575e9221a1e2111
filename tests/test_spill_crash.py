"""SIGKILL the pipeline while a large in-progress transaction sits in its spill files: the restarted pipeline
removes the dead process's spill directory, streams the transaction again, and the destination equals the source.
"""

from __future__ import annotations

from pathlib import Path

from etl_plugin_example.mirror_reader import mirrored_rows

from etl.replication.spill_dir import LOCK, PREFIX
from etl.testing.compare import source_rows
from etl.testing.pipelines import pipeline_config, poll
from etl.testing.pytest_plugin import TestDatabase
from etl.testing.runner import PipelineProcess, write_config

ROWS = 50_000


def spill_directories(base: Path) -> dict[Path, list[str]]:
    """Each spill directory under ``base`` with the names of its spill files."""
    return {d: sorted(p.name for p in d.iterdir() if p.name != LOCK) for d in base.glob(f"{PREFIX}*")}


def test_sigkill_while_spilling_then_restart(pg_database: TestDatabase, tmp_path: Path) -> None:
    db = pg_database
    db.execute("CREATE TABLE big (id bigint PRIMARY KEY, payload text)")
    db.execute("INSERT INTO big VALUES (0, 'before')")
    db.execute("CREATE PUBLICATION pub FOR TABLE big")
    # The walsender streams a transaction in progress once it decoded this much of it (the least it takes).
    db.execute(f"ALTER DATABASE {db.name} SET logical_decoding_work_mem = '64kB'")
    spill, mirror = tmp_path / "spill", tmp_path / "mirror.sqlite"
    spill.mkdir()
    config = pipeline_config(
        db,
        pipeline_id=3,
        batch={"max_fill_ms": 200, "spill_threshold_bytes": 1024, "spill_directory": str(spill)},
        store={"type": "sqlite", "path": str(tmp_path / "state.sqlite")},
        destination={"type": "sqlite_mirror", "path": str(mirror)},
    )
    with PipelineProcess(write_config(tmp_path / "pipeline.toml", config)) as runner, db.connect() as conn:
        runner.start()
        runner.wait_equal(
            lambda: source_rows(conn, "public.big"), lambda: mirrored_rows(mirror, "public.big"), timeout=60
        )
        assert spill_directories(spill) == {}, "made on first use only"

        with conn.transaction():  # in progress while the pipeline dies
            conn.execute("INSERT INTO big SELECT g, md5(g::text) FROM generate_series(1, %s) g", (ROWS,))

            def spilled() -> dict[Path, list[str]]:
                runner.ensure_alive()
                return spill_directories(spill)

            poll(spilled, "the in-progress transaction to spill", until=lambda dirs: any(dirs.values()), timeout=60)
            runner.kill()
            (dead,) = spill_directories(spill)  # the killed process could not remove it
            assert spill_directories(spill)[dead] != []
            conn.execute("UPDATE big SET payload = 'changed' WHERE id % 7 = 0")

        runner.start()
        runner.wait_equal(
            lambda: source_rows(conn, "public.big"), lambda: mirrored_rows(mirror, "public.big"), timeout=120
        )
        assert not dead.exists(), "the restarted pipeline removed the dead process's spill directory"
        runner.stop()
    assert spill_directories(spill) == {}, "a pipeline that stops removes its own"
