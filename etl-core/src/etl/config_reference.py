"""Markdown reference tables of config models, generated from their fields, so docs cannot drift from the code.

``config_table(Model)`` renders ``| key | type | default | meaning |``: the key (its alias when it has one), the
type in TOML terms with its ``ge``/``gt``/``le``/``lt``, ``multiple_of``, length and ``pattern`` constraints, the
default (``required`` when there is none; secrets never shown) and the field's ``description``. A field without a
description is an error, so no key goes undocumented. A nested model is a row of type ``table`` followed by its own
keys, dotted (``spark.master``).

``fill_config_tables(text, models)`` replaces each block of a markdown text that reads::

    <!-- generated: NAME -->
    ...
    <!-- end generated -->

with the table of ``models[NAME]``, leaving the prose around the blocks as it is. Plugins can use both for
their own documentation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import PurePath
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic.fields import FieldInfo

from etl.log import REDACTED, redact_value

_BLOCK = re.compile(r"<!-- generated: (?P<name>\S+) -->\n(?P<body>.*?)<!-- end generated -->", re.S)
_HEADER = "| key | type | default | meaning |\n|---|---|---|---|\n"
_NAMES: dict[Any, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    SecretStr: "secret string",
    SecretBytes: "secret bytes",
}
_BOUNDS = (
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.Le, "le", "≤"),
)
_BINARY_UNITS = ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB"))
_TIME_UNITS = ((86400, "day"), (3600, "hour"))


def config_table(model: type[BaseModel]) -> str:
    """The markdown table of ``model``'s keys; ``ValueError`` naming the field when one has no description."""
    return _HEADER + "".join(_rows(model, "", None))


def fill_config_tables(text: str, models: Mapping[str, type[BaseModel]]) -> str:
    """``text`` with every generated block replaced by the table of the model its marker names.

    ``ValueError`` when a marker names no model of ``models``, a block has no end marker, or a model has no
    block: the mapping and the document must agree.
    """
    used: set[str] = set()

    def table(block: re.Match[str]) -> str:
        name = block["name"]
        if "<!-- generated:" in block["body"]:
            raise ValueError(f"the generated block {name!r} has no <!-- end generated --> before the next block")
        if name not in models:
            raise ValueError(f"the generated block {name!r} names no model; known: {', '.join(sorted(models))}")
        used.add(name)
        return f"<!-- generated: {name} -->\n\n{config_table(models[name])}\n<!-- end generated -->"

    filled = _BLOCK.sub(table, text)
    unused = sorted(models.keys() - used)
    if unused:
        raise ValueError(f"no <!-- generated: NAME --> block for {', '.join(unused)}")
    return filled


class _Required:
    """The default of a field that has none."""


def _rows(model: type[BaseModel], prefix: str, defaults: BaseModel | None) -> list[str]:
    """One row per field of ``model``, keys prefixed; defaults taken from ``defaults`` when the section's
    default is an instance (which may differ from the model's own defaults)."""
    rows = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        description = (field.description or "").strip()
        if not description:
            raise ValueError(
                f"{model.__module__}.{model.__qualname__}.{name} has no description:"
                " give it Field(description=...), the text the configuration reference shows"
            )
        nested = _nested_model(field.annotation)
        if defaults is not None:
            default: Any = getattr(defaults, name)
        elif field.is_required():
            default = _Required
        else:
            default = field.get_default(call_default_factory=True)
        if nested is None:
            shown = _default(name, field.annotation, default)
            rows.append(_row(key, _type(name, field), shown, description))
            continue
        shown = "required" if default is _Required else "none" if default is None else "see below"
        rows.append(_row(key, "table", shown, description))
        rows += _rows(nested, key + ".", default if isinstance(default, BaseModel) else None)
    return rows


def _row(key: str, type_: str, default: str, description: str) -> str:
    cells = (f"`{key}`", type_, default, " ".join(description.split()))
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |\n"


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    inner = _without_none(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        rest = [arg for arg in get_args(annotation) if arg is not NoneType]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _type(name: str, field: FieldInfo) -> str:
    """The field's type for people, with its constraints: ``integer ≥ 1, a multiple of 8``, ``non-empty string``,
    a string ``matching`` its pattern."""
    # Grouped metadata (``StringConstraints``) stands for the single constraints it yields.
    metadata = [
        part
        for item in field.metadata
        for part in (item if isinstance(item, annotated_types.GroupedMetadata) else (item,))
    ]
    described = _describe(field.annotation)
    bounds = [
        f"{sign} {_number(name, getattr(item, attr))}"
        for item in metadata
        for kind, attr, sign in _BOUNDS
        if isinstance(item, kind)
    ]
    if bounds:
        described += " " + ", ".join(bounds)
    for item in metadata:
        if isinstance(item, annotated_types.MultipleOf):
            step = item.multiple_of
            described += f", a multiple of {_number(name, step) if isinstance(step, int | float) else step}"
    shortest = next((item.min_length for item in metadata if isinstance(item, annotated_types.MinLen)), 0)
    longest = next((item.max_length for item in metadata if isinstance(item, annotated_types.MaxLen)), None)
    unit = "characters" if _without_none(field.annotation) in (str, SecretStr) else "items"
    if shortest and longest is not None:
        described = f"{described} of {shortest} to {longest} {unit}"
    elif longest is not None:
        described = f"{described} of at most {longest} {unit}"
    elif shortest == 1:
        described = f"non-empty {described}"
    elif shortest:
        described = f"{described} of at least {shortest} {unit}"
    # ``pattern`` is pydantic's own metadata (``_PydanticGeneralMetadata``), a string or a compiled pattern.
    pattern = next((found for item in metadata if (found := getattr(item, "pattern", None)) is not None), None)
    if pattern is not None:
        described += f" matching {_code(pattern.pattern if isinstance(pattern, re.Pattern) else str(pattern))}"
    return described


def _code(text: str) -> str:
    """``text`` as a markdown code span, fenced by more backticks than any run of them in it."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def _describe(annotation: Any) -> str:
    annotation = _without_none(annotation)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return _describe(args[0])
    if origin is Literal:
        return " | ".join(f"`{_toml(arg)}`" for arg in args)
    if origin in (Union, UnionType):
        return " or ".join(_describe(arg) for arg in args if arg is not NoneType)
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return f"table of {_plural(_describe(args[1]))}" if args else "table"
    if origin in (list, tuple, set, frozenset):
        return f"array of {_plural(_describe(args[0]))}" if args else "array"
    if annotation in _NAMES:
        return _NAMES[annotation]
    if isinstance(annotation, type) and issubclass(annotation, PurePath):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(f"`{_toml(member.value)}`" for member in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _plural(described: str) -> str:
    return described + "s" if described in (*_NAMES.values(), "path", "table") else f"({described})"


def _default(name: str, annotation: Any, value: Any) -> str:
    if value is _Required:
        return "required"
    if value is None:
        return "none"
    named_secret = isinstance(value, str | Mapping) and redact_value(name, value) != value
    if named_secret or _is_secret(annotation) or isinstance(value, SecretStr | SecretBytes):
        return f"`{REDACTED}`"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number(name, value)
    return f"`{_toml(value)}`"


def _is_secret(annotation: Any) -> bool:
    return annotation in (SecretStr, SecretBytes) or any(_is_secret(arg) for arg in get_args(annotation))


def _toml(value: Any) -> str:
    """``value`` written as in a TOML file."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):
        return _toml(value.value)
    if isinstance(value, str | PurePath):
        return json.dumps(str(value), ensure_ascii=False)
    if isinstance(value, Mapping):
        pairs = ", ".join(f"{_toml_key(str(key))} = {_toml(item)}" for key, item in value.items())
        return f"{{ {pairs} }}" if pairs else "{}"
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return str(value)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key, ensure_ascii=False)


def _number(name: str, value: float) -> str:
    """``value``, with a readable size or duration after it when the name gives the unit (``_bytes``, ``_s``)."""
    text = str(value)
    if isinstance(value, float) or value <= 0:
        return text
    if name.endswith("_bytes"):
        for size, unit in _BINARY_UNITS:
            if value % size == 0:
                return f"{text} ({value // size} {unit})"
    if name.endswith(("_seconds", "_s")):
        for size, unit in _TIME_UNITS:
            if value % size == 0:
                count = value // size
                return f"{text} ({count} {unit}{'s' if count > 1 else ''})"
    return text
