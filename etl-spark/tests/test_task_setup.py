"""``prepare_task``: a Spark worker's zip importers stop re-reading unchanged archives before every task.

Run in a child interpreter: the change is to the process's ``zipimport``, for the rest of its life.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import importlib, sys, zipfile, zipimport

    archive = sys.argv[1]
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("zipped_first.py", "VALUE = 1")
    sys.path.insert(0, archive)
    import zipped_first

    from etl_spark.task_setup import prepare_task

    prepare_task()  # the first task (Python 3.13 reads each archive's directory once more, then only on change)
    importlib.invalidate_caches()
    reads = []
    read_directory = zipimport._read_directory
    zipimport._read_directory = lambda path: reads.append(path) or read_directory(path)

    prepare_task()  # the tasks after it
    importlib.invalidate_caches()
    prepare_task()
    importlib.invalidate_caches()
    unchanged = len(reads)

    one, other = zipimport.zipimporter(archive), zipimport.zipimporter(archive + "/")  # one archive, two importers
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr("zipped_second.py", "VALUE = 2")
    importlib.invalidate_caches()
    one.invalidate_caches()
    other.invalidate_caches()
    import zipped_second

    both = one.find_spec("zipped_second") is not None and other.find_spec("zipped_second") is not None
    print(unchanged, zipped_first.VALUE + zipped_second.VALUE, both)
    """
)


def test_unchanged_archives_are_not_read_again_and_changed_ones_are(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "modules.zip")], capture_output=True, text=True, check=True
    )
    unchanged, values, both = done.stdout.split()
    assert unchanged == "0"  # Python 3.11 read the directory again at each invalidate_caches()
    assert values == "3"  # a module added to the archive afterwards is found...
    assert both == "True"  # ...by every importer of that archive
