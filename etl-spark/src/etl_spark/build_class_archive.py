"""``python -m etl_spark.build_class_archive``: build the Spark driver's class archive in a process of its own
(``session.build_class_archive``), as ``class_archive.ClassArchive`` starts it in the background. A module apart, so
that ``class_archive`` (which ``session`` imports) names its builder without importing ``session``."""

from etl_spark.session import build_class_archive

if __name__ == "__main__":
    build_class_archive()
