"""The human status view's counters, supervisor and journal lines (pure formatting)."""

from __future__ import annotations

import pytest

from aiotimer.control._format import format_status
from aiotimer.control.snapshot import ServerInfo, StatusSnapshot, SupervisorInfo

SERVER = ServerInfo(pid=4242, version="1.0", state="serving")


def counters_line(snap: StatusSnapshot) -> str:
    [line] = [s for s in format_status(snap).splitlines() if s.startswith("  requests")]
    return line


def test_cap_counters_are_shown_only_once_a_cap_was_hit() -> None:
    quiet = StatusSnapshot(time=0.0, server=SERVER, counters={"requests": 3})
    assert "cap_rejected" not in counters_line(quiet)
    assert "evicted" not in counters_line(quiet)
    full = StatusSnapshot(
        time=0.0, server=SERVER, counters={"rejected": 2, "cap_rejected": 2, "evicted": 5}
    )
    line = counters_line(full)
    assert "rejected 2" in line
    assert "cap_rejected 2" in line
    assert "evicted 5" in line


@pytest.mark.parametrize(
    ("restarts", "words"), [(0, "0 restarts"), (1, "1 restart"), (2, "2 restarts")]
)
def test_the_supervisor_line_counts_restarts_in_words(restarts: int, words: str) -> None:
    sup = SupervisorInfo(
        run_id="r", state="running", command=("w",), nproc=2, restarts=restarts,
        restarts_in_window=restarts,
    )  # fmt: skip
    view = format_status(StatusSnapshot(time=0.0, server=SERVER, supervisor=sup))
    assert f"{words} ({restarts} in the window)" in view


def test_a_journal_that_cannot_be_written_is_shown_and_a_working_one_is_not() -> None:
    fine = ServerInfo(pid=1, version="1.0", state="serving", journal="/tmp/t.fifo.journal")
    assert "JOURNAL" not in format_status(StatusSnapshot(time=0.0, server=fine))
    broken = ServerInfo(
        pid=1, version="1.0", state="serving", journal="/tmp/t.fifo.journal",
        journal_problem="[Errno 1] Operation not permitted",
    )  # fmt: skip
    view = format_status(StatusSnapshot(time=0.0, server=broken))
    assert "JOURNAL NOT WRITTEN: [Errno 1] Operation not permitted" in view
