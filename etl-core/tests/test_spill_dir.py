"""Spill directories: held by their process, removed once it died (a SIGKILL), kept while it lives."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from etl.errors import EtlError
from etl.replication.spill_dir import LOCK, PREFIX, SpillDirectory, remove_abandoned

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from etl.replication.spill_dir import SpillDirectory

    spill = SpillDirectory(Path(sys.argv[1]))
    (spill.path / "xid-1.pgoutput").write_bytes(b"spilled")
    print(spill.path, flush=True)
    sys.stdin.read()  # until the test kills it
    """
)


def test_the_directory_of_a_killed_process_is_removed_and_live_ones_kept(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        dead = Path(child.stdout.readline().strip())
        ours = SpillDirectory(tmp_path)
        (ours.path / "xid-2.pgoutput").write_bytes(b"spilled")
        assert remove_abandoned(tmp_path) == [] and dead.exists(), "a live process's directory stays"
        child.kill()
        child.wait(timeout=30)
        assert (dead / "xid-1.pgoutput").exists(), "SIGKILL left it behind"

        assert remove_abandoned(tmp_path) == [dead]
        assert not dead.exists() and (ours.path / "xid-2.pgoutput").exists()
        ours.close()
        assert list(tmp_path.iterdir()) == []
    finally:
        child.kill()
        child.wait(timeout=30)


def test_directories_without_a_named_holder_stay(tmp_path: Path) -> None:
    """A lock file naming no process: its maker is between making and locking it. No lock file, or one that is
    not a file: not ours."""
    making, foreign, odd = (tmp_path / f"{PREFIX}{name}" for name in ("making", "foreign", "odd"))
    making.mkdir()
    (making / LOCK).touch()
    foreign.mkdir()
    (odd / LOCK).mkdir(parents=True)
    assert remove_abandoned(tmp_path) == []
    assert making.exists() and foreign.exists() and odd.exists()


def test_made_on_first_use_and_removed_on_close(tmp_path: Path) -> None:
    spill = SpillDirectory(tmp_path)
    assert list(tmp_path.iterdir()) == []
    path = spill.path
    assert path.parent == tmp_path and path.name.startswith(PREFIX) and spill.path == path
    spill.close()
    spill.close()
    assert not path.exists()


def test_an_unusable_base_says_what_to_check(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert remove_abandoned(missing) == []
    with pytest.raises(EtlError, match=f"could not make a spill directory in {missing}") as error:
        _ = SpillDirectory(missing).path
    assert error.value.hint is not None and "spill_directory" in error.value.hint
