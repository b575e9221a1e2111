"""Commit subjects of at most 72 characters: ``git log --oneline``, shortlog and review tools cut longer ones.

Checks the commits made after the one that added this script (earlier history is left as it is), or, with
``--message-file FILE`` (a ``commit-msg`` hook, see .pre-commit-config.yaml), the message about to be committed.
Exits 1 naming each commit whose subject is too long.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

LIMIT = 72
SCRIPT = "scripts/commit_subjects.py"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def checked_commits() -> list[tuple[str, str]]:
    """(hash, subject) of every commit but merges after the one that added this script (in a shallow clone whose
    oldest commit seems to add every file, the commits after that one)."""
    added = git("log", "--diff-filter=A", "--format=%H", "--", SCRIPT).split()
    since = [f"{added[-1]}..HEAD"] if added else ["HEAD"]
    lines = git("log", "--no-merges", "--format=%H %s", *since).splitlines()  # a merge's subject is git's own
    return [(line[:40], line[41:]) for line in lines]


def too_long(subject: str) -> bool:
    return len(subject) > LIMIT


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--message-file", type=Path, help="check this commit message instead of the history")
    args = parser.parse_args()
    if args.message_file is not None:
        subject = next((ln for ln in args.message_file.read_text().splitlines() if not ln.startswith("#")), "")
        found = [("(this commit)", subject)] if too_long(subject) else []
    else:
        found = [(h[:12], s) for h, s in checked_commits() if too_long(s)]
    for commit, subject in found:
        sys.stderr.write(f"{commit}: subject of {len(subject)} characters (at most {LIMIT}): {subject}\n")
    if found:
        sys.stderr.write("put the why in the body, after a blank line (CONTRIBUTING.md, Commits)\n")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
