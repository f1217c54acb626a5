"""The journal of live timers: written off the loop, read back with identity checks."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest

from aiotimer._edges.procfs import boot_id, read_start_time
from aiotimer.core._table import Timer, TimerTable
from aiotimer.server._journal import Journal
from aiotimer.testing import wait_until
from aiotimer.wire import Request

pytestmark = pytest.mark.skipif(boot_id() is None, reason="needs Linux's boot id")


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _written(path: Path) -> list[dict[str, object]]:
    entries: list[dict[str, object]] = json.loads(path.read_bytes())["entries"]
    return entries


@pytest.mark.asyncio
async def test_each_worker_is_journaled_by_its_earliest_signalling_timer(
    tmp_path: Path, sleeper: int
) -> None:
    path, table = tmp_path / "j", TimerTable()
    journal = Journal(path, interval=0.01)
    opts = Request(sleeper, "early", 0.0, 15, grace=2.0, kill_after=5.0)
    table.acquire(Timer(sleeper, "late", 200.0, 9))
    table.acquire(Timer(sleeper, "early", 100.0, 15, request=opts))
    table.acquire(Timer(sleeper, "report-only", 50.0, 0))
    async with anyio.create_task_group() as tg:
        await tg.start(journal.run, table, lambda: 1000.0)
        await wait_until(lambda: path.exists() and _written(path) == [])  # at start: empty
        for timer in table.worker_timers(sleeper):
            journal.acquired(timer)
        await wait_until(lambda: _written(path) != [])
        [entry] = _written(path)
        assert entry["scope_id"] == "early" and entry["signal"] == 15
        assert (entry["mono"], entry["expiration_time"]) == (100.0, 1100.0)
        assert (entry["grace"], entry["kill_after"]) == (2.0, 5.0)
        assert entry["start_time"] == read_start_time(sleeper)
        table.release(sleeper, "early")
        journal.released(sleeper, "early")
        await wait_until(lambda: _written(path)[0]["scope_id"] == "late")
        table.drop_worker(sleeper)
        journal.cleared(sleeper)
        await wait_until(lambda: _written(path) == [])
        tg.cancel_scope.cancel()
    assert [p.name for p in tmp_path.iterdir()] == ["j"], "no temporary file is left"


@pytest.mark.asyncio
async def test_a_restart_restores_live_workers_only(tmp_path: Path, sleeper: int) -> None:
    path, table = tmp_path / "j", TimerTable()
    gone = subprocess.Popen(["true"])
    gone.wait()
    now = time.monotonic()
    journal = Journal(path, interval=0.01)
    for pid in (sleeper, gone.pid):
        table.acquire(Timer(pid, "s", now + 30, 9))
        journal.acquired(table.worker_timers(pid)[0])
    async with anyio.create_task_group() as tg:
        await tg.start(journal.run, table, lambda: 0.0)
        await wait_until(lambda: path.exists() and len(_written(path)) == 2)
        tg.cancel_scope.cancel()
    [req] = Journal(path).load(time.monotonic()).requests
    assert (req.pid, req.scope_id, req.signal, req.mono) == (sleeper, "s", 9, now + 30)
    assert req.start_time == read_start_time(sleeper)


def test_a_recycled_pid_a_past_deadline_and_foreign_files(tmp_path: Path, sleeper: int) -> None:
    path = tmp_path / "j"
    start = read_start_time(sleeper)
    assert start is not None
    body = {
        "format": "aiotimer-journal-1",
        "boot_id": boot_id(),
        "server_pid": 1,
        "entries": [
            {"pid": sleeper, "start_time": start + 1, "scope_id": "other process",
             "mono": 1.0, "expiration_time": 1.0, "signal": 9},
            {"pid": sleeper, "start_time": start, "scope_id": "past due",
             "mono": 1.0, "expiration_time": 1.0, "signal": 9},
        ],
    }  # fmt: skip
    path.write_text(json.dumps(body))
    now = time.monotonic()
    [req] = Journal(path, grace=1.0).load(now).requests
    assert req.scope_id == "past due" and req.mono == now + 1.0
    path.write_text(json.dumps({**body, "boot_id": "another boot"}))
    assert Journal(path).load(now).requests == []
    path.write_text("not json")
    assert Journal(path).load(now).requests == []
    path.unlink()
    os.symlink(tmp_path / "elsewhere", path)
    assert Journal(path).load(now).requests == []


@pytest.mark.asyncio
async def test_a_huge_worker_is_left_out_rather_than_scanned_in_the_loop(
    tmp_path: Path, sleeper: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("aiotimer.server._journal.MAX_SCAN", 3)
    path, table = tmp_path / "j", TimerTable()
    journal = Journal(path, interval=0.01)
    for i in range(5):
        timer = Timer(sleeper, f"s{i}", 100.0 + i, 9)
        table.acquire(timer)
        journal.acquired(timer)
    async with anyio.create_task_group() as tg:
        await tg.start(journal.run, table, lambda: 0.0)
        await wait_until(lambda: path.exists() and _written(path)[0]["scope_id"] == "s0")
        table.release(sleeper, "s0")
        journal.released(sleeper, "s0")
        await wait_until(lambda: _written(path) == [])
        earlier = Timer(sleeper, "early", 50.0, 9)
        table.acquire(earlier)
        journal.acquired(earlier)
        await wait_until(lambda: _written(path) != [] and _written(path)[0]["scope_id"] == "early")
        tg.cancel_scope.cancel()


class _Journaled:
    """A table and its journal (``interval`` seconds), whose encodings are timed (each
    one is a write handed to the journal's thread)."""

    def __init__(
        self, path: Path, interval: float, pid: int, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.table, self.journal, self.pid = TimerTable(), Journal(path, interval=interval), pid
        self.times: list[float] = []
        encode = self.journal._encode

        def counted() -> bytes:
            self.times.append(time.monotonic())
            return encode()

        monkeypatch.setattr(self.journal, "_encode", counted)

    def acquire(self, scope: str, deadline: float) -> None:
        timer = Timer(self.pid, scope, deadline, 9)
        self.table.acquire(timer)
        self.journal.acquired(timer)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The journal's task runs for the duration."""
        async with anyio.create_task_group() as tg:
            await tg.start(self.journal.run, self.table, lambda: 0.0)
            assert len(self.times) == 1, "written once as it starts"
            self.times.clear()  # that write does not count against the interval
            yield
            tg.cancel_scope.cancel()


@pytest.mark.asyncio
async def test_a_change_too_soon_after_a_write_rides_on_the_first_change_after_it(
    tmp_path: Path, sleeper: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Written at the first change after the interval, in the turn that applies it, not
    # by a timer of its own at the interval's end.
    j = _Journaled(tmp_path / "j", 1.0, sleeper, monkeypatch)
    async with j.running():
        j.acquire("a", 100.0)
        await wait_until(lambda: len(j.times) == 1)
        j.acquire("b", 90.0)  # too soon: waits
        # Past the interval, before the backstop (half an interval after it).
        await anyio.sleep(j.times[0] + 1.15 - time.monotonic())
        assert len(j.times) == 1, "written at the interval's end by a timer"
        j.acquire("c", 80.0)
        for _ in range(3):
            await anyio.sleep(0)  # the journal's task runs in this turn; no time passes
        assert len(j.times) == 2


@pytest.mark.asyncio
async def test_a_lone_change_too_soon_after_a_write_is_written_by_the_backstop(
    tmp_path: Path, sleeper: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    j = _Journaled(tmp_path / "j", 0.3, sleeper, monkeypatch)
    async with j.running():
        j.acquire("a", 100.0)
        await wait_until(lambda: len(j.times) == 1)
        j.acquire("b", 90.0)
        await wait_until(lambda: len(j.times) == 2)
        first, second = j.times
        assert second - first >= 0.3, "written again within the interval"
    assert _written(tmp_path / "j")[0]["scope_id"] == "b"


@pytest.mark.asyncio
async def test_a_squatted_journal_is_never_read_nor_written_through_but_taken_back(
    tmp_path: Path, sleeper: int, caplog: pytest.LogCaptureFixture
) -> None:
    path, outside = tmp_path / "j", tmp_path / "outside"
    outside.write_bytes(b"keep")
    os.mkfifo(path)
    with anyio.fail_after(2):  # a FIFO: refused at once, never waited on
        assert Journal(path).load(time.monotonic()).requests == []
    path.unlink()
    path.symlink_to(outside)
    assert Journal(path).load(time.monotonic()).requests == []  # never followed
    journal, table = Journal(path, interval=0.01), TimerTable()
    timer = Timer(sleeper, "s", 100.0, 9)
    table.acquire(timer)
    journal.acquired(timer)
    async with anyio.create_task_group() as tg:
        await tg.start(journal.run, table, lambda: 0.0)
        await wait_until(lambda: not path.is_symlink() and _written(path) != [])
        tg.cancel_scope.cancel()
    assert "refusing the journal" in caplog.text  # the read
    assert "cannot write journal" not in caplog.text and journal.problem is None
    assert outside.read_bytes() == b"keep"
    journal.remove()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside"]


@pytest.mark.asyncio
async def test_a_journal_that_cannot_be_written_says_so_once_and_why(
    tmp_path: Path, sleeper: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))  # no fallback either
    path = tmp_path / "j"
    path.mkdir()  # nothing takes a directory's place
    journal, table = Journal(path, interval=0.01), TimerTable()
    async with anyio.create_task_group() as tg:
        await tg.start(journal.run, table, lambda: 0.0)
        await wait_until(lambda: journal.problem is not None)  # at start, no timer yet
        assert "it is a directory" in (journal.problem or "")
        for n in range(5):
            timer = Timer(sleeper, f"s{n}", 100.0 - n, 9)
            table.acquire(timer)
            journal.acquired(timer)
            await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert caplog.text.count("cannot write journal") == 1
    assert path.is_dir() and not (tmp_path / "missing").exists()


@pytest.mark.asyncio
async def test_a_path_held_for_good_sends_the_journal_to_a_private_directory(
    tmp_path: Path, sleeper: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    path = tmp_path / "j"
    path.mkdir()  # held: nothing takes a directory's place
    journal, table = Journal(path, interval=0.01), TimerTable()
    timer = Timer(sleeper, "s", 100.0, 9)
    table.acquire(timer)
    journal.acquired(timer)
    async with anyio.create_task_group() as tg:
        await tg.start(journal.run, table, lambda: 0.0)
        await wait_until(lambda: journal.path != path and _written(journal.path) != [])
        tg.cancel_scope.cancel()
    fallback = journal.path
    assert fallback.parent == runtime / "aiotimer-journals" and journal.problem is None
    assert fallback.parent.stat().st_mode & 0o777 == 0o700
    assert caplog.text.count("journaling to") == 1 and "cannot write" not in caplog.text
    # The next server on the path finds it there.
    assert [r.scope_id for r in Journal(path).load(time.monotonic()).requests] == ["s"]
    path.rmdir()  # the path is free again: the journal goes back, the fallback goes
    journal.keep(table, 0.0)
    assert _written(path)[0]["scope_id"] == "s" and not fallback.exists()
    journal.remove()
    assert not path.exists()


def _entry(pid: int, scope: str, mono: float, **changes: object) -> dict[str, object]:
    start = read_start_time(pid) if pid > 0 and "start_time" not in changes else None
    entry = {"pid": pid, "start_time": start, "scope_id": scope, "mono": mono,
             "expiration_time": mono + 1e9, "signal": 9}  # fmt: skip
    return {**entry, **changes}


def test_entries_are_checked_one_per_worker_and_counted(tmp_path: Path, sleeper: int) -> None:
    path, now = tmp_path / "j", time.monotonic()
    gone = subprocess.Popen(["true"])
    gone.wait()
    entries = [
        _entry(sleeper, "later", now + 60),
        _entry(sleeper, "earliest", now + 30),
        _entry(sleeper, "", now + 10),  # invalid: an empty scope id
        _entry(sleeper, "negative grace", now + 10, grace=-1.0),
        _entry(sleeper, "report only", now + 10, signal=0),
        _entry(sleeper, "release", now + 10, expiration_time=-1.0),
        _entry(0, "pid 0", now + 10),
        _entry(os.getpid(), "the server itself", now + 10),
        _entry(gone.pid, "exited", now + 10, start_time=1),
    ]
    body = {"format": "aiotimer-journal-1", "boot_id": boot_id(), "server_pid": 1,
            "entries": entries}  # fmt: skip
    path.write_text(json.dumps(body))
    found = Journal(path).load(now)
    [req] = found.requests
    assert (req.pid, req.scope_id) == (sleeper, "earliest")
    assert (found.invalid, found.duplicates, found.gone, found.entries) == (6, 1, 1, 9)
    assert found.describe_dropped() == (
        "; left out: 6 invalid, 1 duplicate, 1 of processes gone or replaced"
    )


def test_keep_writes_every_workers_earliest_timer_at_once(tmp_path: Path, sleeper: int) -> None:
    path, table = tmp_path / "j", TimerTable()
    journal = Journal(path, max_workers=1)
    for i in range(5):  # never told: keep() reads the table itself
        table.acquire(Timer(sleeper, f"s{i}", 100.0 - i, 9))
    table.acquire(Timer(sleeper, "report-only", 1.0, 0))
    assert journal.keep(table, 1000.0) == 1
    [entry] = _written(path)
    assert (entry["scope_id"], entry["expiration_time"]) == ("s4", 1096.0)
    assert journal.keep(TimerTable(), 1000.0) == 0
    assert _written(path) == []


def test_a_journal_of_the_previous_version_restores_and_an_entry_without_mono_does_not(
    tmp_path: Path, sleeper: int
) -> None:
    """The previous version journaled its own entry type: the same keys as the wire's,
    without ``kill_after`` (every key it wrote is listed here). Such a file restores as
    one-tier timers; an entry without a ``mono`` deadline is invalid."""
    path, now = tmp_path / "j", time.monotonic()
    old = {"pid": sleeper, "start_time": read_start_time(sleeper), "scope_id": "old",
           "mono": now + 30, "expiration_time": 1e9, "signal": 15, "grace": 2.0,
           "group": True, "dump": False}  # fmt: skip
    no_mono = {k: v for k, v in old.items() if k != "mono"}
    body = {"format": "aiotimer-journal-1", "boot_id": boot_id(), "server_pid": 1,
            "entries": [old, no_mono]}  # fmt: skip
    path.write_text(json.dumps(body))
    found = Journal(path).load(now)
    [req] = found.requests
    assert (req.scope_id, req.signal, req.grace, req.group) == ("old", 15, 2.0, True)
    assert (req.mono, req.kill_after) == (now + 30, None)
    assert found.invalid == 1
