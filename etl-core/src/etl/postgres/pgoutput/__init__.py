"""Sans-IO decoder of the pgoutput logical replication protocol (versions 1 and 2).

Bytes in, message objects out: one call per XLogData payload, no sockets, no threads. The only
state is whether the decoder is between ``StreamStart`` and ``StreamStop``, because inside a
stream (protocol 2) data messages carry the xid of their (sub)transaction before their body.

Tuple values stay in Postgres text form; turning them into typed values is the job of
:mod:`etl.postgres.codecs`, column by column. A change message does not parse its tuples: it keeps
a ``TupleData`` that points into the payload. Reading its values parses that one tuple;
``tuple_columns`` parses the tuples of a whole batch at once, one array per column, which is what
the change builder does (the per-value loop in Python was the cost of streaming). Messages are
plain slotted records, not frozen dataclasses (frozen ones cost twice as much to create, once per
row); treat them as read-only.

Modules: ``tuples`` (a row's values, ``TupleData``), ``messages`` (what ``decode`` returns), ``decoder``
(``PgOutputDecoder``), ``peek`` (what a payload is, read without decoding it) and ``columns`` (many tuples
parsed at once, ``tuple_columns``).
"""

from etl.postgres.pgoutput.columns import TupleColumns, TupleWidthError, tuple_columns
from etl.postgres.pgoutput.decoder import PgOutputDecoder
from etl.postgres.pgoutput.messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    OldKind,
    Origin,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from etl.postgres.pgoutput.peek import (
    INSERT_TUPLE_START,
    MESSAGE,
    STREAMABLE,
    STREAMED_INSERT_TUPLE_START,
    insert_relation,
    message_lsn,
    message_prefix,
    stream_xid,
    streamed_insert_runs,
)
from etl.postgres.pgoutput.tuples import UNCHANGED_TOAST, PgOutputError, TupleData, Value

__all__ = [
    "INSERT_TUPLE_START",
    "MESSAGE",
    "STREAMABLE",
    "STREAMED_INSERT_TUPLE_START",
    "UNCHANGED_TOAST",
    "Begin",
    "Commit",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "OldKind",
    "Origin",
    "PgOutputDecoder",
    "PgOutputError",
    "Relation",
    "RelationColumn",
    "StreamAbort",
    "StreamCommit",
    "StreamStart",
    "StreamStop",
    "Truncate",
    "TupleColumns",
    "TupleData",
    "TupleWidthError",
    "Type",
    "Update",
    "Value",
    "insert_relation",
    "message_lsn",
    "message_prefix",
    "stream_xid",
    "streamed_insert_runs",
    "tuple_columns",
]
