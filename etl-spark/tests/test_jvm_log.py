"""The lines the Spark JVM prints, read as log events: the shipped log4j2 layout's lines keep their level and
their line breaks; other lines get the level of the stream they came on."""

from __future__ import annotations

from etl_spark.jvm_log import LOG4J_CONFIG, parse


def test_a_log4j_line_keeps_its_level_its_logger_and_its_line_breaks() -> None:
    line = "ERROR org.apache.spark.executor.Executor: Exception in task 0.0\\nboom\\n\tat a.b(C.java:1)\\n"
    assert parse(line, "warning") == (
        "error",
        "Exception in task 0.0\nboom\n\tat a.b(C.java:1)",
        {"source": "org.apache.spark.executor.Executor"},
    )
    assert parse("WARN org.apache.spark.scheduler.TaskSetManager: Lost task 1.0", "info")[0] == "warning"


def test_other_lines_take_their_streams_level_and_start_up_notices_are_debug() -> None:
    assert parse("Traceback (most recent call last):", "warning") == (
        "warning",
        "Traceback (most recent call last):",
        {},
    )
    assert parse("hello from a worker", "info") == ("info", "hello from a worker", {})
    assert parse("WARNING: Using incubator modules: jdk.incubator.vector", "warning")[0] == "debug"
    assert parse("INFO: a line that only looks like log4j's", "warning")[0] == "warning"


def test_the_shipped_layout_is_the_one_parse_reads() -> None:
    assert "appender.stderr.layout.pattern = %p %c: %enc{%m%n%ex}{CRLF}%n" in LOG4J_CONFIG.read_text()
