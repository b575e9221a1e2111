"""etl.config_reference: config models rendered as markdown tables, and generated blocks filled in a document."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints

from etl.config import Integer
from etl.config_reference import config_table, fill_config_tables


class Retention(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keep_s: Integer = Field(2 * 86400, ge=60, description="How long kept.")


class Example(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="What it is called.")
    schema_name: str = Field("etl", alias="schema", max_length=63, description="Where it lives.")
    buffer_bytes: Integer = Field(8 * 1024 * 1024, ge=1024, le=1024**3, description="Buffer | cap.")
    ratio: float = Field(0.5, gt=0, le=1, description="A share.")
    mode: Literal["fast", "safe"] = Field("safe", description="How it\n    runs.")
    verbose: bool = Field(False, description="Says more.")
    files: list[Path] = Field(default_factory=list, max_length=3, description="Files read.")
    labels: dict[str, str] = Field(default_factory=lambda: {"team": "data"}, description="Labels.")
    token: SecretStr = Field(SecretStr("hunter2-default"), description="Secret with a default.")
    password: str = Field("plain-default-pw", description="A secret by its name.")
    retention: Retention | None = Field(None, description="Turns retention on.")
    tuned: Retention = Field(Retention(keep_s=3600), description="Tuned retention.")


EXPECTED = """\
| key | type | default | meaning |
|---|---|---|---|
| `name` | non-empty string | required | What it is called. |
| `schema` | string of at most 63 characters | `"etl"` | Where it lives. |
| `buffer_bytes` | integer ≥ 1024 (1 KiB), ≤ 1073741824 (1 GiB) | 8388608 (8 MiB) | Buffer \\| cap. |
| `ratio` | number > 0, ≤ 1 | 0.5 | A share. |
| `mode` | `"fast"` \\| `"safe"` | `"safe"` | How it runs. |
| `verbose` | boolean | `false` | Says more. |
| `files` | array of paths of at most 3 items | `[]` | Files read. |
| `labels` | table of strings | `{ team = "data" }` | Labels. |
| `token` | secret string | `**********` | Secret with a default. |
| `password` | string | `**********` | A secret by its name. |
| `retention` | table | none | Turns retention on. |
| `retention.keep_s` | integer ≥ 60 | 172800 (2 days) | How long kept. |
| `tuned` | table | see below | Tuned retention. |
| `tuned.keep_s` | integer ≥ 60 | 3600 (1 hour) | How long kept. |
"""


def test_table_shows_keys_types_constraints_defaults_and_descriptions() -> None:
    assert config_table(Example) == EXPECTED


def test_secret_defaults_are_never_shown() -> None:
    table = config_table(Example)
    assert "hunter2-default" not in table
    assert "plain-default-pw" not in table


def test_a_field_without_description_is_an_error_naming_model_and_field() -> None:
    class Undocumented(BaseModel):
        documented: int = Field(1, description="Has one.")
        bare: int = 2

    with pytest.raises(ValueError, match=r"test_config_reference\..*Undocumented\.bare has no description"):
        config_table(Undocumented)

    class Blank(BaseModel):
        blank: int = Field(1, description="  ")

    with pytest.raises(ValueError, match=r"Blank\.blank has no description"):
        config_table(Blank)


def test_an_undocumented_field_of_a_nested_model_is_an_error_too() -> None:
    class Inner(BaseModel):
        bare: int = 2

    class Outer(BaseModel):
        inner: Inner = Field(default_factory=Inner, description="A section.")

    with pytest.raises(ValueError, match=r"Inner\.bare has no description"):
        config_table(Outer)


class Constrained(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slug: str = Field(pattern=r"^[a-z_]+$", description="A slug.")
    code: str | None = Field(None, min_length=2, max_length=8, pattern=r"^[A-Z|]+$", description="A code.")
    tag: Annotated[str, StringConstraints(min_length=1, pattern=r"^t")] = Field("t", description="A tag.")
    quoted: str = Field("x", pattern=r"^`?\w+`?$", description="Maybe in backticks.")
    page_bytes: Integer = Field(8192, ge=1024, multiple_of=1024, description="A page.")
    step: float = Field(0.5, multiple_of=0.25, description="A step.")


def test_table_shows_patterns_and_multiples() -> None:
    """A ``pattern`` is shown after the type and its lengths, a ``multiple_of`` after the bounds."""
    assert config_table(Constrained) == (
        "| key | type | default | meaning |\n|---|---|---|---|\n"
        "| `slug` | string matching `^[a-z_]+$` | required | A slug. |\n"
        "| `code` | string of 2 to 8 characters matching `^[A-Z\\|]+$` | none | A code. |\n"
        '| `tag` | non-empty string matching `^t` | `"t"` | A tag. |\n'
        '| `quoted` | string matching ``^`?\\w+`?$`` | `"x"` | Maybe in backticks. |\n'
        "| `page_bytes` | integer ≥ 1024 (1 KiB), a multiple of 1024 (1 KiB) | 8192 (8 KiB) | A page. |\n"
        "| `step` | number, a multiple of 0.25 | 0.5 | A step. |\n"
    )


DOCUMENT = """\
# Title

Prose before.

<!-- generated: example -->
| stale | table |
<!-- end generated -->

Prose between.

<!-- generated: retention -->
<!-- end generated -->
"""


def test_fill_replaces_only_the_generated_blocks() -> None:
    filled = fill_config_tables(DOCUMENT, {"example": Example, "retention": Retention})
    assert filled == (
        "# Title\n\nProse before.\n\n<!-- generated: example -->\n\n"
        + EXPECTED
        + "\n<!-- end generated -->\n\nProse between.\n\n<!-- generated: retention -->\n\n"
        + config_table(Retention)
        + "\n<!-- end generated -->\n"
    )
    assert fill_config_tables(filled, {"example": Example, "retention": Retention}) == filled


def test_fill_refuses_a_block_naming_no_model() -> None:
    with pytest.raises(ValueError, match="'retention' names no model; known: example"):
        fill_config_tables(DOCUMENT, {"example": Example})


def test_fill_refuses_a_model_without_a_block() -> None:
    with pytest.raises(ValueError, match="no <!-- generated: NAME --> block for extra"):
        fill_config_tables(DOCUMENT, {"example": Example, "retention": Retention, "extra": Retention})


def test_fill_refuses_a_block_without_end_marker() -> None:
    text = DOCUMENT.replace("| stale | table |\n<!-- end generated -->\n", "")
    with pytest.raises(ValueError, match="'example' has no <!-- end generated -->"):
        fill_config_tables(text, {"example": Example, "retention": Retention})
