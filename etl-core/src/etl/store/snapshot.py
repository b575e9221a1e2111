"""Stores that keep a pipeline's whole state as one JSON document, saved again after every change.

For small state held in one object: a file, an object in a bucket, a key in a key-value store. A
subclass implements ``_save_document`` (replace the stored document atomically, or raise) and hands
the stored document to ``_restore_document`` when it opens, and again once it holds the pipeline lock.
It must take a pipeline lock: two instances writing one document would overwrite each other's changes,
and so would a holder going on from a document read before the previous holder's last save.

The document's ``copy_progress`` and ``activity`` keys came after the first release of the format; a document
without them reads as one without copy progress or table activity (and older releases ignore the keys), so the
format number stays 1.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from etl.errors import EtlError, StoreError
from etl.store.base import (
    CopyProgress,
    DestinationSchemaStatus,
    DestinationTableMetadata,
    RetryKind,
    TableState,
    TableStateKind,
)
from etl.store.cached import CachedStore, StateRow
from etl.store.codec import (
    activity_from_obj,
    activity_to_obj,
    lsn_from_text,
    lsn_to_text,
    schema_from_obj,
    schema_to_obj,
)

DOCUMENT_FORMAT = 1


class SnapshotStore(CachedStore):
    """``CachedStore`` whose durable form is one JSON document per pipeline (see the module docstring)."""

    def _save_document(self, document: dict[str, Any]) -> None:
        """Store ``document`` (plain JSON values) so that it replaces the previous one atomically."""
        raise NotImplementedError

    def _restore_document(self, document: Mapping[str, Any] | None) -> None:
        """Replace the cache with a document ``_save_document`` was given (``None``: none stored yet, an empty
        state); ``StoreError`` if it is unusable, the cache then unchanged."""
        with self._replacing_cache():
            if document is not None:
                self._fill(document)

    def _fill(self, document: Mapping[str, Any]) -> None:
        try:
            if document["format"] != DOCUMENT_FORMAT or document["pipeline_id"] != self.pipeline_id:
                raise ValueError(
                    f"format {document['format']!r} of pipeline {document['pipeline_id']!r}, "
                    f"expected format {DOCUMENT_FORMAT} of pipeline {self.pipeline_id}"
                )
            for table_id, history in document["states"].items():
                rows = [StateRow(int(table_id), int(seq), _state_from_obj(state)) for seq, state in history]
                self._states[int(table_id)] = rows
            for obj in document["schemas"]:
                schema = schema_from_obj(obj)
                self._schemas.setdefault(schema.id, {})[schema.snapshot_lsn] = schema
            self._progress.update({worker: lsn_from_text(lsn) for worker, lsn in document["progress"].items()})
            for table_id, obj in document["destination"].items():
                self._metadata[int(table_id)] = DestinationTableMetadata(
                    obj["destination_table"],
                    lsn_from_text(obj["snapshot_lsn"]),
                    DestinationSchemaStatus(obj["status"]),
                    dict(obj["extra"]),
                )
            for table_id, obj in document.get("copy_progress", {}).items():
                self._copy_progress[int(table_id)] = _copy_progress_from_obj(obj)
            for table_id, obj in document.get("activity", {}).items():
                self._activity[int(table_id)] = activity_from_obj(obj)
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(
                f"{self.describe()} holds a state document this version cannot read: {type(exc).__name__}: {exc}",
                hint="restore a backup, or remove it to start the pipeline over",
            ) from None

    def _document(self) -> dict[str, Any]:
        return {
            "format": DOCUMENT_FORMAT,
            "pipeline_id": self.pipeline_id,
            "states": {
                str(table_id): [[row.seq, _state_to_obj(row.state)] for row in history]
                for table_id, history in sorted(self._states.items())
            },
            "schemas": [schema_to_obj(schema) for schema in self.get_table_schemas()],
            "progress": {worker: lsn_to_text(lsn) for worker, lsn in sorted(self._progress.items())},
            "destination": {
                str(table_id): {
                    "destination_table": m.destination_table,
                    "snapshot_lsn": lsn_to_text(m.snapshot_lsn),
                    "status": m.status.value,
                    "extra": dict(m.extra),
                }
                for table_id, m in sorted(self._metadata.items())
            },
            "copy_progress": {
                str(table_id): _copy_progress_to_obj(progress)
                for table_id, progress in sorted(self._copy_progress.items())
            },
            "activity": {str(table_id): activity_to_obj(a) for table_id, a in sorted(self._activity.items())},
        }

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Run one change on the cache, then save the document; put the cache back when either fails."""
        with super()._writing():
            before = (
                {table_id: list(history) for table_id, history in self._states.items()},
                {table_id: dict(versions) for table_id, versions in self._schemas.items()},
                dict(self._progress),
                dict(self._metadata),
                dict(self._copy_progress),
                dict(self._activity),
            )
            try:
                yield
                try:
                    self._save_document(self._document())
                except EtlError:
                    raise
                except Exception as exc:
                    raise StoreError(f"{self.describe()}: saving the state failed: {exc}") from exc
            except BaseException:
                (
                    self._states,
                    self._schemas,
                    self._progress,
                    self._metadata,
                    self._copy_progress,
                    self._activity,
                ) = before
                raise


def _state_to_obj(state: TableState) -> dict[str, Any]:
    return {
        "kind": state.kind.value,
        "lsn": None if state.lsn is None else lsn_to_text(state.lsn),
        "reason": state.reason,
        "hint": state.hint,
        "retry": state.retry.value,
        "retry_at": None if state.retry_at is None else state.retry_at.isoformat(),
    }


def _state_from_obj(obj: Mapping[str, Any]) -> TableState:
    return TableState(
        kind=TableStateKind(obj["kind"]),
        lsn=None if obj["lsn"] is None else lsn_from_text(obj["lsn"]),
        reason=obj["reason"],
        hint=obj["hint"],
        retry=RetryKind(obj["retry"]),
        retry_at=None if obj["retry_at"] is None else datetime.fromisoformat(obj["retry_at"]),
    )


def _copy_progress_to_obj(progress: CopyProgress) -> dict[str, Any]:
    return {
        "rows": progress.rows,
        "estimate": progress.estimate,
        "started_at": progress.started_at.isoformat(),
        "recorded_at": progress.recorded_at.isoformat(),
        "finished": progress.finished,
        "resume_after": progress.resume_after,
    }


def _copy_progress_from_obj(obj: Mapping[str, Any]) -> CopyProgress:
    return CopyProgress(
        rows=int(obj["rows"]),
        estimate=None if obj["estimate"] is None else int(obj["estimate"]),
        started_at=datetime.fromisoformat(obj["started_at"]),
        recorded_at=datetime.fromisoformat(obj["recorded_at"]),
        finished=bool(obj["finished"]),
        resume_after=obj.get("resume_after"),
    )
