"""PathWatch: wakes for changes of one directory entry, not for its neighbours."""

from __future__ import annotations

import ctypes
import errno
import os
import select
from pathlib import Path

import anyio
import pytest

from aiotimer.sources import _pathwatch as pathwatch
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
async def test_a_busy_directory_costs_no_wake_up_and_a_missing_entry_is_seen_made(
    tmp_path: Path,
) -> None:
    target, marker = tmp_path / "t.fifo", tmp_path / "t.fifo.aiotimer"
    os.mkfifo(target)
    marker.write_text("{}")
    with PathWatch(target, also=(marker,), poll_interval=3600) as watch:
        with anyio.move_on_after(0.05):
            await watch.changed()  # watching now
        # What a journal write beside the FIFO does: create, chmod, rename over.
        for i in range(3):
            (tmp_path / "t.fifo.journal.tmp").write_text(str(i))
            os.chmod(tmp_path / "t.fifo.journal.tmp", 0o600)
            os.replace(tmp_path / "t.fifo.journal.tmp", tmp_path / "t.fifo.journal")
        pipe = os.open(target, os.O_RDWR)  # a client writes a line (Linux: no block)
        os.write(pipe, b"x\n")
        os.close(pipe)
        assert select.select([watch._fd], [], [], 0.05)[0] == [], "the loop would wake"
        # The marker replaced (a rename over it): seen.
        (tmp_path / "new").write_text("{}")
        os.replace(tmp_path / "new", marker)
        with anyio.fail_after(5):
            await watch.changed()
        # The FIFO removed, then made again: both seen (the directory is watched while
        # the entry is missing).
        target.unlink()
        with anyio.fail_after(5):
            await watch.changed()
        os.mkfifo(target)
        with anyio.fail_after(5):
            await watch.changed()
        with anyio.move_on_after(0.05) as idle:
            await watch.changed()  # back to the entries' inodes
        (tmp_path / "neighbour").write_text("x")
        assert idle.cancelled_caught
        assert select.select([watch._fd], [], [], 0.05)[0] == [], "the loop would wake"


@pytest.mark.asyncio
async def test_an_entry_whose_inode_cannot_be_watched_is_watched_through_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # inotify needs read access to watch a file (another user's squatter): refused
    # here for the entry, which the directory's watch then covers.
    real = pathwatch._libc()
    assert real is not None
    target = tmp_path / "t.fifo"

    class _Refusing:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def inotify_add_watch(self, fd: int, path: bytes, mask: int) -> int:
            if path == os.fsencode(target):
                ctypes.set_errno(errno.EACCES)
                return -1
            return int(real.inotify_add_watch(fd, path, mask))

    monkeypatch.setattr(pathwatch, "_libc", _Refusing)
    target.write_text("someone else's")
    with PathWatch(target, poll_interval=3600) as watch:
        with anyio.move_on_after(0.05) as idle:
            await watch.changed()
        assert idle.cancelled_caught
        target.unlink()
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
