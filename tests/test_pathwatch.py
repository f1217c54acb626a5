"""PathWatch: wakes for changes of one directory entry, not for its neighbours."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from aiotimer.sources._pathwatch import PathWatch


@pytest.mark.asyncio
async def test_changes_of_the_entry_wake_it_and_neighbours_do_not(tmp_path: Path) -> None:
    target = tmp_path / "t.fifo"
    os.mkfifo(target)
    # Polling once an hour, every wake-up below comes from inotify (Linux has it).
    with PathWatch(target, poll_interval=3600) as watch:
        (tmp_path / "neighbour").write_text("x")
        with anyio.move_on_after(0.2) as idle:
            await watch.changed()
        assert idle.cancelled_caught, "a neighbour's change woke the watch"
        for change in (
            target.unlink,
            lambda: os.symlink(tmp_path / "elsewhere", target),
            lambda: os.replace(tmp_path / "neighbour", target),
        ):
            change()
            with anyio.fail_after(5):
                await watch.changed()


@pytest.mark.asyncio
@pytest.mark.parametrize("why", ["no inotify", "a directory inotify cannot watch"])
async def test_without_inotify_it_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    """The watch returns every poll interval although nothing changed (inotify would
    wait forever): on a platform without inotify (faked), or where inotify refuses the
    directory (here: it does not exist)."""
    path = tmp_path / "x"
    if why == "no inotify":
        monkeypatch.setattr("aiotimer.sources._pathwatch._libc", lambda: None)
    else:
        path = tmp_path / "missing" / "x"
    with PathWatch(path, poll_interval=0.01) as watch:
        for _ in range(3):
            with anyio.fail_after(5):
                await watch.changed()
