"""The messages of the pgoutput protocol, as the decoder returns them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from etl.lsn import Lsn
from etl.postgres.pgoutput.tuples import TupleData
from etl.schema import ReplicaIdentity

OldKind = Literal["K", "O"]
"""``K``: the old row holds the replica identity key columns only; ``O``: every column (REPLICA IDENTITY FULL)."""


@dataclass(slots=True)
class Begin:
    final_lsn: Lsn
    """LSN of the transaction's commit record; every change of the transaction is ordered under it."""
    commit_ts: datetime
    xid: int


@dataclass(slots=True)
class Commit:
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    """The LSN just past the commit record: what the client confirms once the transaction is durable."""
    commit_ts: datetime


@dataclass(slots=True)
class Origin:
    lsn: Lsn
    name: str


@dataclass(slots=True)
class RelationColumn:
    flags_key: bool
    """Part of the replica identity key."""
    name: str
    type_oid: int
    type_modifier: int


@dataclass(slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[RelationColumn, ...]
    xid: int | None = None


@dataclass(slots=True)
class Type:
    oid: int
    namespace: str
    name: str
    xid: int | None = None


@dataclass(slots=True)
class Insert:
    relation_oid: int
    new: TupleData
    xid: int | None = None


@dataclass(slots=True)
class Update:
    relation_oid: int
    old_kind: OldKind | None
    old: TupleData | None
    new: TupleData
    xid: int | None = None


@dataclass(slots=True)
class Delete:
    relation_oid: int
    old_kind: OldKind
    old: TupleData
    xid: int | None = None


@dataclass(slots=True)
class Truncate:
    cascade: bool
    restart_identity: bool
    relation_oids: tuple[int, ...]
    xid: int | None = None


@dataclass(slots=True)
class LogicalMessage:
    transactional: bool
    lsn: Lsn
    prefix: str
    content: bytes
    xid: int | None = None


@dataclass(slots=True)
class StreamStart:
    xid: int
    first_segment: bool


@dataclass(slots=True)
class StreamStop:
    pass


@dataclass(slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_ts: datetime


@dataclass(slots=True)
class StreamAbort:
    xid: int
    """The toplevel transaction."""
    subxid: int
    """The aborted subtransaction; equal to ``xid`` when the whole transaction aborted."""


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)
