"""The rule a copy waits by before it writes: every standby slot past what it read (sans-IO parts)."""

from __future__ import annotations

from etl.lsn import Lsn
from etl.postgres.copy_session import ChunkSnapshot
from etl.postgres.standby_slots import SlotRow, behind, parse_setting


def test_the_setting_names_each_slot_once_quoted_or_not() -> None:
    assert parse_setting("") == ()
    assert parse_setting("standby_1") == ("standby_1",)
    assert parse_setting('standby_1, "Standby 2" ,,') == ("standby_1", "Standby 2")


def test_a_chunk_snapshot_carries_the_standby_slots_it_waits_for() -> None:
    read = ChunkSnapshot.parse("731:735:732 0/3000148 a, b")
    assert (read.wal, read.standby_slots) == (Lsn.parse("0/3000148"), ("a", "b"))
    assert ChunkSnapshot.parse("731:731: 0/3000148 ").standby_slots == ()


def test_only_physical_slots_flushed_past_the_read_let_a_copy_write() -> None:
    lsn = Lsn.parse("0/5000000")
    rows = [
        SlotRow("caught_up", "physical", Lsn.parse("0/5000000"), "reserved"),
        SlotRow("lagging", "physical", Lsn.parse("0/4FFFFFF"), "reserved"),
        SlotRow("logical", "logical", Lsn.parse("0/6000000"), "reserved"),
        SlotRow("lost", "physical", None, "lost"),
    ]
    assert behind(["caught_up"], rows, lsn) == []
    reasons = behind(["caught_up", "lagging", "logical", "lost", "missing"], rows, lsn)
    assert [reason.split(":")[0] for reason in reasons] == ["lagging", "logical", "lost", "missing"]
    assert "flushed up to 0/4FFFFFF, not yet 0/5000000" in reasons[0]
    assert behind([], rows, lsn) == []
