"""Squatted paths the server owns: ``aiotimer serve`` serves or refuses in one line.

Each test plants something at a path ``aiotimer serve --fifo F --event-log L`` owns (the
statistics file ``L.stats.json``, its old temporary name, ``L`` itself, the control
directory ``F.control``), then checks, each bound 5 s: the server either serves (a hung
worker's block is reaped) or exits 1 or 2 with one ``aiotimer serve: error: ...`` line;
it stops on SIGTERM; its peak RSS stays under 200 MB; and no file outside its own is
written (a precious file that a planted symlink names keeps its bytes).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _procs import Sentinel, env, send, serve_argv

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

#: The bound on starting, refusing, reaping and stopping: a server starts in ~0.5 s on
#: an idle machine; the failures it guards against never start or never stop at all.
WITHIN = 15.0
#: The most a server may ever hold resident (it needs ~40 MB).
MAX_RSS_KB = 200 * 1024
PRECIOUS = b"precious: no server may write here\n"


class Served:
    """One ``aiotimer serve`` run in ``tmp_path / "run"``, its stderr in a file beside."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "run"
        self.dir.mkdir(mode=0o700)
        self.fifo = self.dir / "t.fifo"
        self.log = self.dir / "events.jsonl"
        self.stats = self.dir / "events.jsonl.stats.json"
        self.stderr = tmp_path / "stderr.txt"
        self.outside = tmp_path / "outside"
        self.outside.mkdir()
        self.precious = self.outside / "precious"
        self.precious.write_bytes(PRECIOUS)

    @contextmanager
    def start(self, *options: str) -> Iterator[subprocess.Popen[bytes]]:
        """The server (with ``--event-log`` unless ``options`` say otherwise), killed at
        the end if it still runs. Its address space is capped at 2 GiB, so a server
        that reads without bound fails fast instead of eating the machine."""

        def cap_memory() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

        argv = serve_argv(self.fifo, *(options or ("--event-log", str(self.log))))
        with self.stderr.open("wb") as err:
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={**env(), "MALLOC_ARENA_MAX": "2"},
                preexec_fn=cap_memory,  # noqa: PLW1509 (a limit; no threads yet)
            )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(WITHIN)

    def serving(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether the server serves (``True``) or exited (``False``) within 5 s."""
        deadline = time.monotonic() + WITHIN
        marker = Path(f"{self.fifo}.aiotimer")
        while proc.poll() is None:
            if self.fifo.exists() and marker.exists():
                return True
            if time.monotonic() > deadline:
                pytest.fail(f"the server neither served nor refused within {WITHIN} s")
            time.sleep(0.01)
        return False

    def assert_serves(self, proc: subprocess.Popen[bytes]) -> None:
        """Serving: a hung worker's block is reaped; RSS bounded; SIGTERM stops it."""
        assert self.serving(proc), f"exited {proc.returncode}: {self.stderr.read_text()}"
        with Sentinel() as hung:
            hung.arm(self.fifo, after=0.2)
            hung.wait_dead(WITHIN)
        assert peak_rss_kb(proc.pid) < MAX_RSS_KB
        self.assert_stops(proc)

    def assert_stops(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(WITHIN) == 0
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not stop on SIGTERM within {WITHIN} s")

    def assert_refuses(self, proc: subprocess.Popen[bytes]) -> str:
        """Refused: exit 1 or 2 within 5 s, one line on stderr (returned)."""
        assert not self.serving(proc), "the server served"
        assert proc.returncode in (1, 2)
        lines = self.stderr.read_text().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("aiotimer serve: error: ")
        return lines[0]

    def assert_nothing_outside_written(self, *planted: Path) -> None:
        assert [p.name for p in self.outside.iterdir()] == ["precious"]
        assert self.precious.read_bytes() == PRECIOUS
        leftovers = {p for p in self.dir.iterdir() if p.name.endswith(".tmp")}
        assert leftovers == set(planted), "temporary files left behind"


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for text in f:
            if text.startswith("VmHWM:"):
                return int(text.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def release_line(pid: int, scope: str) -> bytes:
    body = {"version": 1, "pid": pid, "scope_id": scope, "expiration_time": -1, "signal": 0}
    return json.dumps(body).encode() + b"\n"


@pytest.fixture
def run(tmp_path: Path) -> Served:
    return Served(tmp_path)


def test_a_stats_file_that_is_a_fifo_is_ignored(run: Served) -> None:
    os.mkfifo(run.stats, 0o600)
    with run.start() as proc:
        run.assert_serves(proc)
    assert run.stats.is_fifo(), "a FIFO in the way is left alone, never replaced"
    run.assert_nothing_outside_written()


def test_a_stats_file_linked_to_dev_zero_is_never_read(run: Served) -> None:
    run.stats.symlink_to("/dev/zero")
    with run.start() as proc:
        run.assert_serves(proc)
    assert run.stats.is_symlink()
    run.assert_nothing_outside_written()


def test_a_symlink_at_the_old_temporary_name_is_never_written_through(run: Served) -> None:
    """Today's name was ``<stats>.<pid>.tmp``: planted for the server's pid as soon as
    it exists, it must stay untouched while the statistics are saved for real."""
    with run.start() as proc, Sentinel() as worker:
        planted = run.dir / f"{run.stats.name}.{proc.pid}.tmp"
        planted.symlink_to(run.precious)
        assert run.serving(proc)
        worker.arm(run.fifo, after=60.0, scope="released")
        send(run.fifo, release_line(worker.pid, "released"))  # one duration sample
        run.assert_serves(proc)  # SIGTERM saves the statistics
    assert planted.is_symlink() and planted.resolve() == run.precious
    saved = json.loads(run.stats.read_bytes())
    assert saved["sites"], "the statistics were saved"
    run.assert_nothing_outside_written(planted)


def test_an_event_log_that_is_a_fifo_is_refused_in_one_line(run: Served) -> None:
    os.mkfifo(run.log, 0o600)
    with run.start() as proc:
        message = run.assert_refuses(proc)
    assert str(run.log) in message and "FIFO" in message
    run.assert_nothing_outside_written()


def test_an_event_log_linked_outside_is_refused_in_one_line(run: Served) -> None:
    run.log.symlink_to(run.precious)
    with run.start() as proc:
        message = run.assert_refuses(proc)
    assert str(run.log) in message and "symbolic link" in message
    run.assert_nothing_outside_written()


def test_a_control_directory_of_another_user_is_refused_in_one_line(run: Served) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another user")
    control = run.dir / f"{run.fifo.name}.control"
    control.mkdir(mode=0o700)
    os.chown(control, 65534, 65534)
    with run.start("--no-journal") as proc:
        message = run.assert_refuses(proc)
    assert str(control) in message and "uid 65534" in message
    assert list(control.iterdir()) == [], "nothing was made in someone else's directory"
    run.assert_nothing_outside_written()
