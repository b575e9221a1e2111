"""Array literals (``{1,NULL,"a"}``, any number of dimensions) -> Arrow lists of the element's codec."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from etl.postgres.codecs.base import BadValue, Codec, show


@lru_cache(maxsize=64)
def _array_token(delimiter: str) -> re.Pattern[str]:
    d = re.escape(delimiter)
    return re.compile(rf'"((?:[^"\\]|\\.)*)"|([{{}}])|({d})|([^"{{}}{d}]+)', re.DOTALL)


_ESCAPE: Final = re.compile(r"\\(.)", re.DOTALL)

Nested = list["Nested | str | None"]


def parse_array(text: str, delimiter: str = ",") -> Nested:
    """A Postgres array literal (``{1,NULL,"a \\"b\\""}``, nested for more dimensions) -> nested lists of text.

    Custom lower bounds (``[0:1]={...}``) are dropped: Arrow lists always start at 0.
    """
    if text.startswith("{") and text.endswith("}") and '"' not in text and text.count("{") == 1 == text.count("}"):
        body = text[1:-1]  # the common case: one dimension, nothing quoted
        return [None if item == "NULL" else item for item in body.split(delimiter)] if body else []
    start = text.index("=") + 1 if text.startswith("[") else 0
    root: Nested | None = None
    stack: list[Nested] = []
    position = start
    for match in _array_token(delimiter).finditer(text, start):
        quoted, brace, _, bare = match.groups()
        if match.start() != position or (not stack and (brace != "{" or root is not None)):
            break  # a gap, a value outside the braces, or text after the closing brace
        position = match.end()
        if quoted is not None:
            stack[-1].append(_ESCAPE.sub(r"\1", quoted))
        elif brace == "{":
            node: Nested = []
            if stack:
                stack[-1].append(node)
            else:
                root = node
            stack.append(node)
        elif brace == "}":
            stack.pop()
        elif bare is not None:
            stack[-1].append(None if bare == "NULL" else bare)
    if root is None or stack or position != len(text):
        raise BadValue(f"not an array literal: {show(text)}")
    return root


def array_codec(element: Codec, depth: int, delimiter: str) -> Codec:
    target = element.type
    for _ in range(depth):
        target = pa.list_(target)

    def decode(chunk: pa.Array) -> pa.Array:
        elements: list[str | None] = []
        offsets: list[list[int]] = [[0] for _ in range(depth)]
        for text in chunk.to_pylist():
            if text is None:
                offsets[0].append(offsets[0][-1])
                continue
            try:
                _flatten(parse_array(text, delimiter), 0, depth, offsets, elements)
            except _Dimensions as exc:
                raise BadValue(
                    f"a {exc.found}-dimensional array in a column of {depth}-dimensional arrays: {show(text)}",
                    hint="declare the column with as many [] as its arrays have dimensions",
                ) from None
        values = element.decode(pa.array(elements, pa.string()))
        for level in range(depth - 1, -1, -1):
            mask = pc.is_null(chunk) if level == 0 and chunk.null_count else None
            values = pa.ListArray.from_arrays(pa.array(offsets[level], pa.int32()), values, mask=mask)
        return values

    return Codec(target, decode)


class _Dimensions(Exception):
    def __init__(self, found: int) -> None:
        self.found = found


def _flatten(node: Nested, level: int, depth: int, offsets: list[list[int]], elements: list[str | None]) -> None:
    offsets[level].append(offsets[level][-1] + len(node))
    if level == depth - 1:
        for item in node:
            if isinstance(item, list):
                raise _Dimensions(_dimensions(node) + level)
            elements.append(item)
        return
    for item in node:
        if not isinstance(item, list):
            raise _Dimensions(level + 1)
        _flatten(item, level + 1, depth, offsets, elements)


def _dimensions(node: Nested | str | None) -> int:
    return 1 + _dimensions(node[0]) if isinstance(node, list) and node else int(isinstance(node, list))
