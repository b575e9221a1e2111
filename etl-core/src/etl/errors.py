"""The error types of the framework.

Every error carries a message that says what is wrong and, where one exists, a ``hint`` that says
what to do about it. Messages never contain secrets.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar


class EtlError(Exception):
    """Base of every error raised on purpose by the framework.

    ``transient`` says whether the failure may pass by itself, so that a retry (with backoff, or of the table on a
    timer) can mend it; each kind of error has its default (``passes``), and a raiser that knows better says so.
    ``may_pass`` is the one question the engine asks of any exception.
    """

    passes: ClassVar[bool] = False
    """``transient`` when the raiser does not say."""

    def __init__(self, message: str, *, hint: str | None = None, transient: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.transient = self.passes if transient is None else transient

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class ConfigError(EtlError):
    """The configuration is invalid."""


class PluginError(EtlError):
    """A plugin could not be loaded, or plugins conflict."""


class SourceError(EtlError):
    """The source Postgres is unreachable, misconfigured or refused an operation."""


class TransientError(EtlError):
    """A failure expected to pass (lost connection, timeout); the operation is retried with backoff."""

    passes = True


class StoreError(EtlError):
    """The state store failed or holds data this version cannot use."""


class PipelineLockedError(StoreError):
    """Another process already runs this pipeline id against the same store."""


class DestinationError(EtlError):
    """A destination rejected a write or is unreachable.

    ``transient`` says what a retry can do. True (the default): the failure may pass (the destination unreachable,
    busy, or a write that lost to another writer), and the engine retries the write with backoff. False: no retry
    mends it (a refused permission, a quota spent for the day, a lake this version cannot write), so the write
    fails at once with the error's hint, instead of after minutes of retries.
    """

    passes = True


class RuntimeSetupError(EtlError):
    """The process cannot do the work at all, for any table (no usable Java for Spark, say): not one table's
    fault, and no retry mends it. A worker that meets it stops the pipeline instead of erroring its table."""


class TableError(EtlError):
    """A problem confined to one table (bad value, unsupported type); that table goes Errored.

    ``transient`` says the cause may pass by itself (a destination-side failure of this one table, say):
    the engine then copies the table again on a timer. Otherwise the table waits for the user.
    """

    def __init__(
        self, message: str, *, hint: str | None = None, table_id: int | None = None, transient: bool = False
    ) -> None:
        super().__init__(message, hint=hint, transient=transient)
        self.table_id = table_id


class TypeChangeError(TableError):
    """A column's type changed to one the destination cannot give the table it has (its files, its column): only a
    copy with the new type mends it. ``[copy] on_type_change`` says whether the engine makes that copy itself."""


class TableErrors(EtlError):
    """Several tables failed in one write, each for a reason of its own: every one goes Errored at once (rather
    than one per attempt of the write), and the write goes on with the other tables."""

    def __init__(self, errors: Sequence[TableError]) -> None:
        names = "; ".join(e.message for e in errors)
        super().__init__(f"{len(errors)} tables failed: {names}", hint="each table's own error says what to do")
        self.errors = tuple(errors)


def may_pass(error: BaseException) -> bool:
    """Whether ``error`` may go away without the user doing anything: an error of ours says so itself
    (``EtlError.transient``); an ``OSError`` may; so may an exception no one classified, which comes from a
    destination's own libraries (Spark, a cloud client) more often than not."""
    return error.transient if isinstance(error, EtlError) else True


@contextmanager
def naming_table(table_id: int) -> Iterator[None]:
    """Name ``table_id`` in a ``TableError`` raised inside that names no table, so the engine errors that table
    only (a destination's ``write_events`` around the work of one table, say). A ``NotImplementedError`` there
    (pyarrow's ``ArrowNotImplementedError``: no kernel for a type of this table's) is that table's error too."""
    try:
        yield
    except TableError as exc:
        if exc.table_id is None:
            exc.table_id = table_id
        raise
    except NotImplementedError as exc:
        raise TableError(
            f"the destination cannot handle this table: {exc}",
            hint="report it with the table's column types; leave the table out of the publication meanwhile",
            table_id=table_id,
        ) from exc
