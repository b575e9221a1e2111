"""A class-data-sharing archive of the classes a Spark session loads, so that later JVMs start on less CPU.

A JVM spends most of a Spark session's start loading and verifying some ten thousand classes. Java 17's
dynamic CDS archive (``-XX:ArchiveClassesAtExit``) records them once, already parsed and verified; a JVM
started with ``-XX:SharedArchiveFile`` maps them instead. Measured here, a ``local[2]`` session then starts
on 3.8 CPU seconds instead of 6.9, a ``local-cluster[2,1,1024]`` one (whose executors map it too) on 9
instead of 14.5. A JVM that cannot use the archive (another Java, other jars, other collector) ignores it
and starts as before; ``-Xlog:cds=off`` keeps it from saying so.

The archive belongs to one Java, one set of Spark jars and one set of JVM options: ``archive_path`` names
it after all three, so a change of any makes a new one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import structlog

from etl.errors import DestinationError
from etl_spark.session import SparkSettings, find_java, get_spark, stop_spark

log = structlog.get_logger(__name__)

QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""JVM options that keep class-data-sharing's notes (skipped classes, an unusable archive) off the console."""


def archive_path(directory: Path) -> Path:
    """Where the archive for this Java, these Spark jars and the current ``JDK_JAVA_OPTIONS`` lives."""
    import pyspark

    java = find_java().resolve()
    key = hashlib.sha256()
    key.update(f"{java}\0{java.stat().st_mtime_ns}\0{os.environ.get('JDK_JAVA_OPTIONS', '')}".encode())
    for jar in sorted((Path(pyspark.__file__).parent / "jars").iterdir()):
        key.update(f"\0{jar.name}\0{jar.stat().st_size}".encode())
    return directory / f"spark-classes-{key.hexdigest()[:16]}.jsa"


def java_options(archive: Path) -> str:
    """The JVM options that make a JVM map ``archive``."""
    return f"-XX:SharedArchiveFile={archive} {QUIET}"


def ensure_archive(directory: Path) -> Path:
    """The archive for this machine's Java and Spark, made first if there is none yet (half a minute)."""
    archive = archive_path(directory)
    if not archive.exists():
        directory.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".making-", suffix=".jsa")
        os.close(fd)
        try:
            options = f"{os.environ.get('JDK_JAVA_OPTIONS', '')} -XX:ArchiveClassesAtExit={temporary} {QUIET}"
            done = subprocess.run(
                [sys.executable, "-m", __name__],
                env=os.environ | {"JDK_JAVA_OPTIONS": options},
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if done.returncode != 0:
                raise DestinationError(
                    f"could not make a class-data archive of Spark's classes: {done.stderr.strip()[-2000:]}",
                    hint="check that a Spark session starts (java on PATH or JAVA_HOME, pyspark installed)",
                )
            os.replace(temporary, archive)  # whole or not at all, also for a test run beside this one
        finally:
            Path(temporary).unlink(missing_ok=True)
        log.info("made a class-data archive of spark's classes", path=str(archive))
    return archive


def load_classes() -> None:
    """Start a session, do what the destinations do (Arrow in, Parquet out and back, a join, Python tasks),
    then end the JVM and wait for it: it writes the archive on its way out."""
    from pyspark import SparkContext

    spark = get_spark(SparkSettings(master="local[2]"))
    with tempfile.TemporaryDirectory() as work:
        rows = spark.createDataFrame(pa.table({"id": list(range(100)), "v": [str(i) for i in range(100)]}))
        rows.write.parquet(f"{work}/rows")
        back = spark.read.parquet(f"{work}/rows")
        back.join(rows.select("id"), "id").groupBy("v").count().collect()
        back.mapInArrow(lambda batches: batches, back.schema).toArrow()
    gateway = SparkContext._gateway
    stop_spark()
    assert gateway is not None
    process = gateway.proc  # set by pyspark's launch_gateway
    process.stdin.close()  # the JVM exits when its standard input ends
    process.wait(timeout=120)


if __name__ == "__main__":
    load_classes()
