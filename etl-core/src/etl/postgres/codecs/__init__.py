"""Postgres text values -> Arrow: the one place that maps Postgres types to Arrow types.

Input is always a string array of values in Postgres text output form (SQL NULL is null), read
from COPY or from pgoutput; output is an Arrow array of ``arrow_type(column)``. Conversions are
vectorised with ``pyarrow.compute``; only rare shapes (infinite or BC dates, intervals, arrays)
are parsed value by value. The session settings every connection pins (``TimeZone=UTC``,
``DateStyle=ISO``, ``IntervalStyle=postgres``, ``extra_float_digits=3``, ``bytea_output=hex``)
fix the text forms parsed here. The mapping is documented for users in ``docs/types.md``.

Nothing becomes NULL that was not NULL, and nothing is silently changed: a value that cannot be
represented raises ``TableError``.

Modules: ``columns`` (a column's codec, Arrow type and field; ``decode_text_column``), ``scalars`` (the
built-in scalar types), ``numeric``, ``calendar`` (dates, times, timestamps, intervals), ``arrays``
(array literals), ``base`` (what a codec is made of) and ``python`` (Arrow values back to Python values).
"""

from etl.postgres.codecs.arrays import parse_array
from etl.postgres.codecs.base import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from etl.postgres.codecs.calendar import (
    DATE_INFINITY,
    DATE_MINUS_INFINITY,
    TIMESTAMP_INFINITY,
    TIMESTAMP_MINUS_INFINITY,
)
from etl.postgres.codecs.columns import (
    BUILTIN_ARRAYS,
    BUILTIN_TYPES,
    arrow_field,
    arrow_type,
    decode_text_column,
    type_name,
)
from etl.postgres.codecs.numeric import NUMERIC_OID
from etl.postgres.codecs.python import python_values

__all__ = [
    "BUILTIN_ARRAYS",
    "BUILTIN_TYPES",
    "DATE_INFINITY",
    "DATE_MINUS_INFINITY",
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "NUMERIC_OID",
    "TIMESTAMP_INFINITY",
    "TIMESTAMP_MINUS_INFINITY",
    "arrow_field",
    "arrow_type",
    "decode_text_column",
    "parse_array",
    "python_values",
    "type_name",
]
