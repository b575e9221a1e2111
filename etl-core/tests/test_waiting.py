"""``etl.postgres.waiting.Waiter`` runs libpq steps on a socket: deadlines, silences, stop checks. The
socket is one end of a local socket pair; ``Socket`` stands in for a ``PGconn``, of which the waiter only reads
``socket``."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from etl.postgres.generators import READ, PQGen
from etl.postgres.waiting import Expired, Waiter


@dataclass
class Socket:
    """A stand-in for ``PGconn`` (named as such): the waiter needs only its socket."""

    socket: int


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def reads(sock: socket.socket, count: int) -> PQGen[bytes]:
    """Wait until ``count`` bytes came, reading what each wait brings."""
    got = b""
    while len(got) < count:
        yield READ
        got += sock.recv(count - len(got))
    return got


def test_a_step_runs_to_its_result(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    theirs.sendall(b"abc")
    waiter = Waiter(Socket(ours.fileno()))
    assert waiter.run(reads(ours, 3), deadline=time.monotonic() + 5) == b"abc"
    waiter.close()


def test_deadline_and_silence_expire_apart(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, _ = pair
    waiter = Waiter(Socket(ours.fileno()))
    with pytest.raises(Expired) as deadline:
        waiter.run(reads(ours, 1), deadline=time.monotonic() + 0.05)
    with pytest.raises(Expired) as silence:
        waiter.run(reads(ours, 1), silence=0.05)
    assert not deadline.value.silent and silence.value.silent
    waiter.close()


@pytest.mark.alone  # times the wait
def test_a_check_ends_a_wait(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, _ = pair
    waiter = Waiter(Socket(ours.fileno()))
    started = time.monotonic()

    def stop_after_a_while() -> None:
        if time.monotonic() - started > 0.2:
            raise InterruptedError("stopped")

    with pytest.raises(InterruptedError):
        waiter.run(reads(ours, 1), check=stop_after_a_while)
    assert time.monotonic() - started < 2  # within a poll interval or so, not never
    waiter.close()
