"""A FIFO's mode never lets group or others read it (the API refuses such a mode)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiotimer.server import TimerServer
from aiotimer.sources import FifoSource


@pytest.mark.parametrize("mode", [0o666, 0o644, 0o640, 0o604, 0o1600])
def test_a_mode_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    fifo = tmp_path / "t.fifo"
    with pytest.raises(ValueError, match=r"read the FIFO|permission bits") as refused:
        FifoSource(fifo, mode=mode)
    assert len(str(refused.value).splitlines()) == 1
    with pytest.raises(ValueError, match=r"read the FIFO|permission bits"):
        TimerServer(fifo=fifo, fifo_mode=mode)
    assert not fifo.exists()


@pytest.mark.parametrize("mode", [0o600, 0o620, 0o622, 0o200, 0o000])
def test_a_mode_no_other_may_read_is_kept(tmp_path: Path, mode: int) -> None:
    assert repr(FifoSource(tmp_path / "t.fifo", mode=mode)).endswith(f"mode={mode:#o}>")
