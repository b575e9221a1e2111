"""``etl run`` as a child process for end-to-end tests: written to a config file, started, killed, restarted.

Any destination and store fit: build the config with ``etl.testing.pipelines.pipeline_config`` and pass
their sections there::

    config = pipeline_config(db, destination={"type": "sqlite_mirror", "path": str(mirror)})
    with PipelineProcess(write_config(tmp_path / "pipeline.toml", config)) as run:
        run.start()
        ...
        run.kill()  # SIGKILL: no shutdown, no flush
        run.start()  # resumes from the store

What the process writes to stdout and stderr goes to a log file beside the config (kept across restarts),
so a failing test can show why ``etl run`` exited.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from pydantic import SecretStr

from etl.config import PipelineConfig
from etl.testing.pipelines import poll_pause

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def write_config(path: Path, config: PipelineConfig) -> Path:
    """Write ``config`` as the TOML file ``etl run -c`` reads, values as given (no ``${VAR}``); return ``path``."""
    path.write_text(_toml(config.model_dump(exclude_none=True, by_alias=True)))
    return path


def _toml(table: Mapping[str, Any], prefix: str = "") -> str:
    """A pipeline file for nested mappings of strings, numbers, booleans, paths, secrets and lists of them.

    ``$`` in strings is written ``$$``, so that ``load_config`` reads the value back as given.
    """
    lines = [f"{_key(key)} = {_value(value)}" for key, value in table.items() if not isinstance(value, Mapping)]
    for key, value in table.items():
        if isinstance(value, Mapping):
            name = f"{prefix}.{_key(key)}" if prefix else _key(key)
            lines += ["", f"[{name}]", _toml(value, name).rstrip("\n")]
    return "\n".join(lines).strip() + "\n"


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, SecretStr):  # the child process needs the secret itself
        value = value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):  # a JSON string is a TOML basic string when non-ASCII is left as is
        return json.dumps(str(value).replace("$", "$$"), ensure_ascii=False)  # "$$": a "$", not ${VAR}
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def difference(expected: object, actual: object, shown: int = 5) -> str:
    """What differs between two readings: per key of two mappings of row lists, the rows only one side has."""
    if not (isinstance(expected, Mapping) and isinstance(actual, Mapping)):
        return f"expected {str(expected)[:1000]}, read {str(actual)[:1000]}"
    parts = []
    for key in sorted({*expected, *actual}, key=str):
        want, got = expected.get(key), actual.get(key)
        if want == got:
            continue
        if isinstance(want, list) and isinstance(got, list):
            wanted, read = Counter(map(repr, want)), Counter(map(repr, got))
            missing = list((wanted - read).elements())[:shown]
            extra = list((read - wanted).elements())[:shown]
            parts.append(f"{key}: {len(want)} rows expected, {len(got)} read; missing {missing}; unexpected {extra}")
        else:
            parts.append(f"{key}: expected {str(want)[:500]}, read {str(got)[:500]}")
    return "; ".join(parts)


class PipelineProcess:
    """``etl run -c config`` as a child process that a test starts, kills with SIGKILL and restarts."""

    def __init__(self, config: Path, log_level: str = "warning", log_format: str = "console") -> None:
        self.config = config
        self.log_level = log_level
        self.log_format = log_format
        self.log = config.with_suffix(".log")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert not self.alive(), "etl run is already running"
        options = ["--log-level", self.log_level, "--log-format", self.log_format]
        with self.log.open("ab") as log:  # the child holds its own descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "etl.cli", *options, "run", "-c", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ensure_alive(self) -> None:
        """Fail, with the end of the log, when ``etl run`` has exited."""
        assert self.alive(), f"etl run exited:\n{self.output()[-4000:]}"

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to shut down, flush or release anything."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def kill_mid_write(
        self,
        staged: Callable[[], set[Any]],
        timeout: float = 240,
        attempts: int = 3,
        probe: Callable[[], object] | None = None,
    ) -> None:
        """SIGKILL as soon as ``staged()`` lists an entry it did not list before; fail unless it still does after.

        For destinations that stage a write's files where they remove them once the write is committed: an
        entry still there after the kill proves the process died in the middle of a write. A write can commit
        between the poll that saw its entry and the kill; then ``etl run`` starts again (it resumes from what
        was committed) and the next write is tried, up to ``attempts`` kills in all.

        The poll runs every 10 ms. When ``staged()`` costs much (a catalog query, file footers), ``probe`` gives a
        cheap value that changes whenever ``staged()`` may have gained an entry (the names and sizes of the files
        on disk): ``staged()`` is then asked only after it changed, and once more after the kill.
        """
        deadline = time.monotonic() + timeout
        for attempt in range(1, attempts + 1):
            earlier = staged()
            last = probe() if probe is not None else None
            while True:
                changed = True
                if probe is not None:
                    current = probe()
                    changed, last = current != last, current
                if changed and staged() - earlier:
                    break
                self.ensure_alive()
                assert time.monotonic() < deadline, f"nothing was staged within {timeout:.0f}s"
                time.sleep(0.01)
            self.kill()
            if staged() - earlier:
                return
            assert attempt < attempts, f"each of {attempts} writes was committed before its kill landed"
            self.start()

    def wait_equal(
        self,
        expected: Callable[[], object],
        actual: Callable[[], object],
        *,
        not_yet: tuple[type[Exception], ...] = (),
        timeout: float = 300,
        interval: float = 0.5,
    ) -> None:
        """Poll until ``actual() == expected()`` (the destination's rows and the source's, say) while ``etl run`` runs,
        every ``interval`` seconds or twice as long as a poll takes (``poll_pause``).

        ``actual`` raising one of ``not_yet`` (the destination has no table yet) counts as not equal. Fails with
        the rows that differ and the end of the log on timeout, and at once, with the end of the log, when the
        process exits.
        """
        deadline = time.monotonic() + timeout
        while True:
            began = time.monotonic()
            wanted = expected()
            try:
                last = actual()
            except not_yet as exc:
                last = exc
            if last == wanted:
                return
            self.ensure_alive()
            assert time.monotonic() < deadline, (
                f"no match within {timeout:.0f}s; {difference(wanted, last)}\nthe log ends:\n{self.output()[-4000:]}"
            )
            time.sleep(poll_pause(time.monotonic() - began, interval))

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM, as an operator would, and fail unless ``etl run`` drains and exits with 0."""
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
            assert code == 0, f"etl run exited with {code} on SIGTERM:\n{self.output()[-4000:]}"
        finally:
            self.process.kill()

    def output(self) -> str:
        """Everything the process wrote so far, every start included."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def __enter__(self) -> PipelineProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
