"""BigQuery's failures as the engine's errors: what passes is retried, what does not says what to do.

BigQuery reports a failure as an HTTP status and, per error, a ``reason``
(https://cloud.google.com/bigquery/docs/error-messages). The client library retries some of them
itself for a while; what still reaches the destination is classified here:

- retried with backoff by the engine (``TransientError``): 429 and ``rateLimitExceeded``, 500, 502,
  503, 504 and ``backendError`` / ``internalError``, connections reset, refused or timed out, a
  transaction BigQuery aborted for a concurrent update of the same table (by another writer), and a job
  BigQuery already holds (409: the client resent a call whose answer was lost; the watermark decides
  whether its work is done);
- stopped at once (a ``DestinationError`` that is not ``transient``) with the quota's name and the setting that
  avoids it: ``quotaExceeded`` and the other daily limits;
- stopped at once with the missing IAM permission: 401 and 403 ``accessDenied``;
- anything else: a ``DestinationError`` with BigQuery's message, retried unless BigQuery refused the request
  itself (another 4xx: a dataset not found, an invalid request).

A rejected statement (400 ``invalidQuery``, bad values) is the destination's to report: it knows the
table (``TableError``).
"""

from __future__ import annotations

import re
from typing import Final

from etl.api import DestinationError, EtlError, TransientError

RETRIED_STATUS: Final = frozenset({429, 500, 502, 503, 504})
RETRIED_REASONS: Final = frozenset({"rateLimitExceeded", "backendError", "internalError", "jobBackendError"})
QUOTA_REASONS: Final = frozenset({"quotaExceeded", "dailyLimitExceeded", "limitExceeded"})
_PERMISSION: Final = re.compile(r"Permission ([\w.]+) denied")
_CONCURRENT: Final = re.compile(
    r"aborted due to concurrent update|could not serialize access to table .* due to concurrent update", re.IGNORECASE
)
"""BigQuery's words for a transaction (or a DML statement) that lost to a concurrent one on the same table."""
_JOB_EXISTS: Final = re.compile(r"Already Exists: Job\b")
"""BigQuery's 409 for a job id (or query request id) it already holds: the client resent a call whose first
answer was lost, so the job ran, or runs, and its outcome is not known here."""
_QUOTA_HINT: Final = (
    "each batch runs one load job and one transaction per table it touches; run them less often: raise the"
    " destination's min_apply_interval_s (see the Quotas section of docs/destinations/bigquery.md), or ask"
    " Google for a higher quota. The pipeline resumes from its watermark"
)


def passes(exc: BaseException) -> bool:
    """Whether a rejected statement failed for a reason that passes (not its data): a limit, a quota, a
    transaction aborted by a concurrent one."""
    return bool(reasons(exc) & (RETRIED_REASONS | QUOTA_REASONS)) or _lost_to_concurrent(exc)


def _lost_to_concurrent(exc: BaseException) -> bool:
    return bool(_CONCURRENT.search(str(getattr(exc, "message", None) or exc)))


def reasons(exc: BaseException) -> set[str]:
    """The ``reason`` of each error BigQuery reported in ``exc``."""
    errors = getattr(exc, "errors", None) or []
    return {str(e.get("reason")) for e in errors if isinstance(e, dict) and e.get("reason")}


def classify(exc: BaseException, doing: str) -> EtlError | None:
    """The engine's error for a failure of BigQuery or of the connection to it while ``doing``; ``None`` when
    it is neither (a bug, say: let it through)."""
    from google.api_core import exceptions
    from requests import exceptions as http

    if isinstance(exc, exceptions.RetryError):  # the client's own retries ran out: what failed last decides
        last = exc.cause
        return (
            classify(last, doing)
            if last is not None
            else TransientError(f"BigQuery kept failing while {doing}: {exc.message}", hint="retried with backoff")
        )
    if isinstance(exc, (http.ConnectionError, http.Timeout, ConnectionError, TimeoutError)):
        return TransientError(f"BigQuery did not answer while {doing}: {type(exc).__name__}", hint="retried")
    if not isinstance(exc, exceptions.GoogleAPICallError):
        return None
    found, message, status = reasons(exc), exc.message, exc.code
    if found & QUOTA_REASONS:
        quota = next(iter(sorted(found & QUOTA_REASONS)))
        return DestinationError(
            f"BigQuery quota exceeded ({quota}) while {doing}: {message}", hint=_QUOTA_HINT, transient=False
        )
    if status in RETRIED_STATUS or found & RETRIED_REASONS or _lost_to_concurrent(exc):
        return TransientError(f"BigQuery failed while {doing} ({status}): {message}", hint="retried with backoff")
    if status == 409 and _JOB_EXISTS.search(message or ""):
        return TransientError(
            f"BigQuery already holds the job it was sent again while {doing}, after an answer was lost: {message}",
            hint="the batch is retried; each table's watermark skips what was applied",
        )
    if status == 401:
        return DestinationError(
            f"BigQuery refused the credentials while {doing}: {message}",
            hint="check credentials_file, or the application default credentials (gcloud auth application-default"
            " login)",
            transient=False,
        )
    if status == 403:
        permission = _PERMISSION.search(message or "")
        missing = permission.group(1) if permission else "the permission BigQuery names above"
        return DestinationError(
            f"BigQuery denied {missing} while {doing}: {message}",
            hint=f"grant the pipeline's service account a role with {missing} on the dataset or project"
            " (roles/bigquery.dataEditor and roles/bigquery.jobUser hold all the destination needs)",
            transient=False,
        )
    return DestinationError(  # a request BigQuery refused (4xx: not found, invalid) is refused again
        f"BigQuery failed while {doing} ({status}): {message}",
        hint="see BigQuery's message",
        transient=not 400 <= (status or 0) < 500,
    )
