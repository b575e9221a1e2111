"""Spark's Python daemon for executors on this machine: ``pyspark.daemon``, with pyspark loaded from its installed
package rather than from the zip of it that Spark puts first on the workers' path.

Spark starts an executor's Python daemon with ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's source zip first
on ``PYTHONPATH``. When pyspark is pip-installed, ``SPARK_HOME`` is the package itself and the zips hold its own
code, but Python keeps no compiled bytecode of modules it imports from a zip: every daemon, and every worker it
forks (pyspark 4.1+ imports the worker's modules after the fork), compiled pyspark from source again, a third of
the CPU a small job's Python workers used. Those two zips are dropped from the path when they are the installed
package's own; a zip of any other Spark (a cluster's distribution) stays. ``etl_spark.session`` names this module
in ``spark.python.daemon.module`` for local masters, whose executors run the pipeline's own interpreter.
"""

from __future__ import annotations

import importlib.machinery
import sys
from collections.abc import Sequence
from pathlib import Path


def installed_path(path: Sequence[str]) -> list[str]:
    """``path`` without the zips under the installed pyspark package's ``python/lib``."""
    spec = importlib.machinery.PathFinder.find_spec("pyspark", [p for p in path if not p.endswith(".zip")])
    if spec is None or spec.origin is None:  # no installed package: the zips are the only pyspark there is
        return list(path)
    own = Path(spec.origin).parent / "python" / "lib"
    return [p for p in path if not (p.endswith(".zip") and Path(p).parent == own)]


if __name__ == "__main__":
    sys.path[:] = installed_path(sys.path)
    from pyspark.daemon import manager

    manager()
