"""Validating config into its models, with errors a person can act on.

Each error is one line keyed by the dotted key of the file; an unknown key close to a known one says "did you
mean", a pattern a field documents in words (``form``) is said in those words, and a message that would read as
a secret in logs is keyed as one.
"""

from __future__ import annotations

import difflib
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from etl.errors import ConfigError
from etl.log import redact_text

M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Any, source: str, prefix: str = "") -> M:
    """Validate ``data`` into ``model``; errors name ``source`` and the dotted key."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid configuration:\n" + format_errors(exc, prefix, model)) from None


def format_errors(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """One line per error, keyed by the dotted key. An unknown key close to a key of ``model`` at that place
    says "did you mean", and the missing-key error of the key it meant is left out (one mistake, one line)."""
    errors = exc.errors(include_url=False, include_input=False)
    unknown = {err["loc"]: _unknown_key(model, err["loc"]) for err in errors if err["type"] == "extra_forbidden"}
    meant = {(*loc[:-1], key) for loc, (_, key) in unknown.items() if key is not None}
    lines = []
    for err in errors:
        key = ".".join(str(p) for p in (prefix, *err["loc"]) if p != "")
        message = err["msg"]
        if err["type"] == "missing":
            if err["loc"] in meant:
                continue
            message = "required key is missing"
        elif err["type"] == "extra_forbidden":
            message = unknown[err["loc"]][0]
        elif err["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        elif err["type"] == "string_pattern_mismatch" and model is not None:
            message = _pattern_message(model, err["loc"]) or message
        line = f"  {key}: {message}" if key else f"  {message}"  # a check across sections has no key
        if redact_text(line) != line:  # "password: <message>" would read as a secret in logs and be masked
            line = f"  {key} (secret): {message}"
        lines.append(line)
    return "\n".join(lines)


def _unknown_key(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> tuple[str, str | None]:
    """The message for an unknown key at ``loc``, and the key of ``model`` it was likely meant to be."""
    known = list(_fields_at(model, loc[:-1])) if model is not None else []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if close:
        return f'unknown key; did you mean "{close[0]}"?', close[0]
    if known:
        return f"unknown key; the keys here are {', '.join(known)}", None
    return "unknown key (check the spelling; see docs/configuration.md)", None


def _fields_at(model: type[BaseModel], path: tuple[Any, ...]) -> dict[str, FieldInfo]:
    """The fields of the config model at ``path`` inside ``model``, by the key a file writes (alias or name)."""
    current: Any = model
    for part in path:
        if isinstance(part, int):
            continue
        field = _fields_at(current, ()).get(str(part)) if _is_model(current) else None
        if field is None:
            return {}
        current = _model_in(field.annotation)
    if not _is_model(current):
        return {}
    return {field.alias or name: field for name, field in current.model_fields.items()}


def _pattern_message(model: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """What a string matching a field's ``pattern`` looks like, in words, when the field says (``form``)."""
    field = _fields_at(model, loc[:-1]).get(str(loc[-1]))
    extra = field.json_schema_extra if field is not None and isinstance(field.json_schema_extra, dict) else {}
    if field is None or "form" not in extra:
        return None
    example = f", for example {field.examples[0]}" if field.examples else ""
    return f"expected {extra['form']}{example}"


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _model_in(annotation: Any) -> Any:
    """The config model an annotation holds (``Section``, ``Section | None``, ``list[Section]``), else None."""
    if _is_model(annotation):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
