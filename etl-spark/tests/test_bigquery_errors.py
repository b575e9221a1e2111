"""BigQuery failures as the engine's errors (``etl_spark.bigquery.errors``), from the client library's own
exception types as it raises them for each HTTP answer."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions

from etl.errors import DestinationError, TransientError
from etl_spark.bigquery.errors import classify, passes


def answer(status: int, reason: str, message: str = "") -> exceptions.GoogleAPICallError:
    return exceptions.from_http_status(status, message or reason, errors=[{"reason": reason, "message": message}])


@pytest.mark.parametrize(
    "failure",
    [
        answer(429, "rateLimitExceeded"),
        answer(403, "rateLimitExceeded", "Exceeded rate limits: too many table update operations"),
        answer(500, "backendError"),
        answer(502, "badGateway"),
        answer(503, "backendError"),
        answer(504, "timeout"),
        requests.exceptions.ConnectionError("Connection reset by peer"),
        requests.exceptions.ReadTimeout("read timed out"),
        ConnectionResetError(104, "Connection reset by peer"),
        answer(
            400, "invalidQuery", "Transaction is aborted due to concurrent update against table p:d._etl_watermarks"
        ),
        answer(400, "invalidQuery", "Could not serialize access to table p:d.t due to concurrent update"),
        answer(409, "duplicate", "Already Exists: Job p:US.0e885a24-7f19-4477-8eb9-04623ba7bb39"),
    ],
)
def test_passing_failures_are_retried(failure: BaseException) -> None:
    assert isinstance(classify(failure, "loading staged rows"), TransientError)


def test_an_exceeded_quota_names_the_quota_and_the_setting_that_avoids_it() -> None:
    error = classify(
        answer(403, "quotaExceeded", "Quota exceeded: Your table exceeded quota for table update operations"),
        "merging into public.orders",
    )
    assert isinstance(error, DestinationError) and not isinstance(error, TransientError)
    assert not error.transient  # stops at once: retries within minutes do not bring a daily quota back
    assert "quotaExceeded" in error.message and "public.orders" in error.message
    assert "min_apply_interval_s" in error.hint


def test_a_denied_permission_is_named() -> None:
    denied = answer(403, "accessDenied", "Access Denied: Permission bigquery.tables.updateData denied on table x")
    error = classify(denied, "writing public.orders")
    assert isinstance(error, DestinationError) and not isinstance(error, TransientError)
    assert "bigquery.tables.updateData" in error.message and "bigquery.tables.updateData" in error.hint
    refused = classify(answer(401, "unauthorized", "Request had invalid authentication credentials"), "starting")
    assert isinstance(refused, DestinationError) and "credentials" in refused.hint
    assert not error.transient and not refused.transient


def test_a_request_bigquery_refused_is_not_retried_and_other_failures_are() -> None:
    missing = classify(answer(404, "notFound", "Not found: Dataset p:d"), "merging into public.orders")
    assert isinstance(missing, DestinationError) and not missing.transient
    unknown = classify(answer(507, "whatever", "something new"), "merging into public.orders")
    assert isinstance(unknown, DestinationError) and unknown.transient


def test_only_a_job_already_held_is_a_passing_conflict() -> None:
    error = classify(answer(409, "duplicate", "Already Exists: Table p:d.orders"), "creating public.orders")
    assert isinstance(error, DestinationError) and not isinstance(error, TransientError)


def test_a_retry_that_ran_out_is_judged_by_its_last_failure() -> None:
    ran_out = exceptions.RetryError("Timeout of 2.0s exceeded", answer(503, "backendError"))
    assert isinstance(classify(ran_out, "loading"), TransientError)
    quota = exceptions.RetryError("Timeout", answer(403, "quotaExceeded"))
    assert not isinstance(classify(quota, "loading"), TransientError)


def test_what_is_not_bigquerys_is_let_through() -> None:
    assert classify(KeyError("x"), "writing") is None


def test_partitioning_by_a_column_that_is_no_date_errors_the_table() -> None:
    from etl.errors import TableError
    from etl.schema import ColumnSchema, TableName, TableSchema
    from etl_spark.bigquery.types import table_options

    schema = TableSchema(1, TableName("public", "t"), (ColumnSchema("id", 23, primary_key=True), ColumnSchema("n", 25)))
    assert table_options(schema, None) == "CLUSTER BY `id`"
    with pytest.raises(TableError, match="not a date or timestamp"):
        table_options(schema, "n")
    with pytest.raises(TableError):
        table_options(schema, "missing")


def test_a_statement_rejected_for_a_passing_reason_is_not_blamed_on_its_data() -> None:
    concurrent = answer(400, "invalidQuery", "Transaction is aborted due to concurrent update against table x")
    assert passes(concurrent) and passes(answer(400, "quotaExceeded")) and passes(answer(400, "backendError"))
    assert not passes(answer(400, "invalidQuery", "Bad double value: x"))
