"""The class archive of Spark's JVMs: built once in the background, then mapped by every later JVM;
an unfit archive costs only the speed. Each JVM here runs in a process of its own (one per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etl.testing.pipelines import poll
from etl_spark.class_archive import UNUSED_DAYS, ClassArchive, cache_dir
from etl_spark.session import SparkSettings, _archive_option, _class_archive, find_java

START_SPARK = """
import json, sys
from pathlib import Path
from etl.log import configure_logging
configure_logging("json", "debug")
from etl_spark import session
spark = session.get_spark(session.SparkSettings(master=sys.argv[1]))
assert spark.range(10).count() == 10
pid = session._gateway.proc.pid
jvms = {"driver": pid}
for entry in Path("/proc").glob("[0-9]*"):  # a local-cluster's executor: a child of the driver JVM (its worker's)
    try:
        parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        if parent == pid and "CoarseGrainedExecutorBackend" in (entry / "cmdline").read_text():
            jvms["executor"] = int(entry.name)
    except (OSError, ValueError):
        continue
print(json.dumps({name: {"maps": open(f"/proc/{p}/maps").read(), "cmdline": open(f"/proc/{p}/cmdline").read()}
                  for name, p in jvms.items()}))
"""


def start_spark(cache: Path, master: str = "local[1]") -> tuple[dict[str, dict[str, str]], list[dict[str, str]]]:
    """A process that starts a session on ``master`` with ``cache`` as XDG_CACHE_HOME: its JVMs' memory maps and
    command lines (``driver``, and a ``local-cluster``'s ``executor``), and the events it logged."""
    result = subprocess.run(
        [sys.executable, "-c", START_SPARK, master],
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), [json.loads(line) for line in result.stderr.splitlines()]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.slow  # four JVMs, one after the other: a session, the builder's, a session and its executor
def test_the_first_start_builds_the_archive_and_the_next_jvm_maps_it(cache: Path) -> None:
    archive = _class_archive(find_java())
    assert archive.path.parent == cache / "etl-spark" and not archive.path.exists()
    jvms, events = start_spark(cache)
    assert "-XX:SharedArchiveFile" not in jvms["driver"]["cmdline"]
    assert any(e["event"] == "building a class archive for spark in the background" for e in events), events
    poll(
        lambda: sorted(cache.rglob("*")),
        "an archive built (the files in the cache)",
        until=lambda files: archive.path in files,
        timeout=240,
        least=0.5,
    )
    jvms, events = start_spark(cache, "local-cluster[1,1,1024]")
    assert str(archive.path) in jvms["driver"]["maps"], "the driver JVM did not map the archive"
    assert str(archive.path) in jvms["executor"]["maps"], "the executor JVM did not map the archive"
    assert not any("class archive" in e["event"] for e in events)


def test_an_unfit_archive_costs_only_the_speed(cache: Path) -> None:
    archive = _class_archive(find_java())
    archive.path.parent.mkdir(parents=True)
    archive.path.write_bytes(b"not an archive" * 1000)
    jvm = start_spark(cache)[0]["driver"]  # it asserts the session ran a query
    assert "-XX:SharedArchiveFile" in jvm["cmdline"] and str(archive.path) not in jvm["maps"]


def test_building_an_archive_removes_the_ones_unused_for_a_week(tmp_path: Path) -> None:
    java, jars = find_java(), tmp_path / "jars"
    jars.mkdir()
    archive = ClassArchive(java, jars, tmp_path)
    old, recent = tmp_path / "spark-old.jsa", tmp_path / "spark-recent.jsa"
    for path in (old, recent):
        path.write_bytes(b"an archive")
    week_ago = time.time() - UNUSED_DAYS * 86400 - 60
    os.utime(old, (week_ago, week_ago))
    assert not archive.adopt()  # nothing built: nothing moves, nothing is removed
    archive.part.write_bytes(b"the new archive")
    assert archive.adopt()
    assert archive.path.read_bytes() == b"the new archive" and not archive.part.exists()
    assert recent.exists() and not old.exists()
    os.utime(archive.path, (week_ago, week_ago))
    assert archive.use_option() is not None and archive.path.stat().st_mtime > week_ago  # used: kept


def test_archives_off_start_no_builder(cache: Path) -> None:
    assert _archive_option(SparkSettings(class_archive=False), find_java()) is None
    assert not cache_dir().exists()


def test_the_archive_is_named_for_its_java_its_jars_and_the_jvm_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java, jars = tmp_path / "bin" / "java", tmp_path / "jars"
    java.parent.mkdir()
    java.write_text("a java")
    (tmp_path / "lib" / "server").mkdir(parents=True)
    (tmp_path / "lib" / "server" / "libjvm.so").write_text("a jvm")
    jars.mkdir()
    (jars / "spark-core.jar").write_text("classes")
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-Xmx1g")
    first = ClassArchive(java, jars, tmp_path).path
    assert first == ClassArchive(java, jars, tmp_path).path
    (jars / "spark-sql.jar").write_text("more classes")
    second = ClassArchive(java, jars, tmp_path).path
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-Xmx2g")
    third = ClassArchive(java, jars, tmp_path).path
    (tmp_path / "lib" / "server" / "libjvm.so").write_text("the jvm updated in place")
    fourth = ClassArchive(java, jars, tmp_path).path
    assert len({first, second, third, fourth}) == 4
