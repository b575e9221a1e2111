"""``scripts/commit_subjects.py``, the lint step's check of commit subjects, on a repository of its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "commit_subjects.py"


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def check(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/commit_subjects.py", *args], cwd=repo, capture_output=True, text=True, check=False
    )


def test_subjects_after_the_check_was_added_are_at_most_72_characters(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "an old subject " + "x" * 80)  # before the check: left alone
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "Add the check")
    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "s" * 72 + "\n\nA body of any length " + "y" * 100)
    assert check(tmp_path).returncode == 0

    git(tmp_path, "commit", "-q", "--allow-empty", "-m", "t" * 73)
    result = check(tmp_path)
    assert result.returncode == 1
    assert "subject of 73 characters (at most 72)" in result.stderr
    assert "an old subject" not in result.stderr


def test_a_commit_message_file_is_checked_as_the_commit_msg_hook_gives_it(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("# a comment git adds\nA short subject\n\n" + "body " * 40 + "\n")
    assert check(tmp_path, "--message-file", str(message)).returncode == 0
    message.write_text("z" * 73 + "\n")
    assert check(tmp_path, "--message-file", str(message)).returncode == 1
