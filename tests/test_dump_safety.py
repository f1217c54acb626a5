"""Dump files are never trusted: planted FIFOs, foreign files and forged headers."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import anyio
import pytest
from _procs import BOUND, Sentinel, events, serving

from aiotimer import diagnostics
from aiotimer._edges.procfs import read_start_time
from aiotimer.diagnostics import (
    collect_dump,
    dump_path_for,
    ensure_dump_handler,
    hook_info,
    install_dump_handler,
    private_dump_dir,
    uninstall_dump_handler,
)
from aiotimer.errors import UnsafePathError


def _never(signum: int) -> None:
    raise AssertionError(f"signal {signum} sent")


def test_a_planted_fifo_never_blocks_the_worker(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    os.mkfifo(dump_path_for(os.getpid(), tmp_path))
    with pytest.raises(UnsafePathError, match="it is a FIFO, not a regular file"):
        install_dump_handler(dump_dir=tmp_path)  # O_EXCL: it never opens the FIFO


def test_a_stale_file_of_this_user_is_replaced_not_adopted(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    stale = dump_path_for(os.getpid(), tmp_path)
    stale.write_text("someone else's secrets\n")
    try:
        assert install_dump_handler(dump_dir=tmp_path) == stale
        assert "secrets" not in stale.read_text()
        assert stale.read_text().startswith("aiotimer-dump-hook")
    finally:
        uninstall_dump_handler()


def test_a_dump_dir_others_can_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafePathError, match=r"group or others may write to it \(mode 0777\)"):
        private_dump_dir(shared)
    monkeypatch.setenv(diagnostics.ENV_DUMP_DIR, str(shared))
    assert ensure_dump_handler() is None  # reported, never raised
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        private_dump_dir(link)
    fresh = private_dump_dir(tmp_path / "fresh")
    assert fresh.stat().st_mode & 0o777 == 0o700


@pytest.mark.asyncio
async def test_the_collector_never_blocks_on_a_planted_fifo(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    os.mkfifo(dump_path_for(os.getpid(), tmp_path))
    with anyio.fail_after(2):
        assert hook_info(os.getpid(), tmp_path) is None
        assert await collect_dump(os.getpid(), send_signal=_never, dump_dir=tmp_path) is None


@pytest.mark.asyncio
async def test_a_forged_header_never_chooses_the_signal(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    pid = os.getpid()
    header = f"aiotimer-dump-hook pid={pid} start={read_start_time(pid)} signal=19\n"
    dump_path_for(pid, tmp_path).write_text(header)  # a "hook" asking for SIGSTOP
    assert await collect_dump(pid, send_signal=_never, dump_dir=tmp_path) is None


@pytest.mark.process
@pytest.mark.timeout(60)
def test_planted_dump_files_never_stop_the_server_reaping(tmp_path: Path) -> None:
    """--dump, a FIFO planted at one worker's dump path, a forged SIGSTOP header at
    another's: every worker is reaped with SIGKILL soon after its dump step."""
    fifo, log, dumps = tmp_path / "t.fifo", tmp_path / "events.jsonl", tmp_path / "dumps"
    dumps.mkdir(mode=0o700)
    options = ("--dump-dir", str(dumps), "--dump-timeout", "0.5", "--event-log", str(log))
    with Sentinel() as planted, Sentinel() as forged, Sentinel() as plain:
        os.mkfifo(dump_path_for(planted.pid, dumps))
        start = read_start_time(forged.pid)
        dump_path_for(forged.pid, dumps).write_text(
            f"aiotimer-dump-hook pid={forged.pid} start={start} signal={int(signal.SIGSTOP)}\n"
        )
        with serving(fifo, *options) as server:
            for s in (planted, forged, plain):
                s.arm(fifo, after=0.5)
            for s in (planted, forged, plain):
                s.wait_dead()
                assert s.proc.wait(BOUND) == -signal.SIGKILL
            server.send_signal(signal.SIGTERM)
            assert server.wait(BOUND) == 0
        records = events(log)
    for s in (planted, forged, plain):
        # The dump step is bounded by --dump-timeout (0.5 s); then the kill.
        assert s.reap_latency(records) < 0.5 + 0.5
    stops = [r for r in records if r["event"] == "worker_reaped" and r["signal"] == 19]
    assert stops == [], "a forged header chose the signal"
    assert json.dumps(records).count("worker_survived") == 0


def test_a_worker_thread_reading_never_blocks_a_planted_fifo_open(tmp_path: Path) -> None:
    """Even the blocking helper returns at once (non-blocking open, then fstat)."""
    os.chmod(tmp_path, 0o700)
    path = dump_path_for(12345, tmp_path)
    os.mkfifo(path)
    done = threading.Event()
    t = threading.Thread(target=lambda: (hook_info(12345, tmp_path), done.set()), daemon=True)
    started = time.monotonic()
    t.start()
    assert done.wait(2), "hook_info blocked on a FIFO"
    assert time.monotonic() - started < 2


@pytest.mark.process
@pytest.mark.timeout(60)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory away")
def test_a_squatted_default_dump_dir_never_stops_serve_dump(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user made ``aiotimer-dumps-<uid>`` first: ``serve --dump`` says in one
    line what it does instead, serves, and reaps (the hooks cannot write there)."""
    temp = tmp_path / "tmp"
    temp.mkdir(mode=0o1777)
    squatted = temp / f"aiotimer-dumps-{os.geteuid()}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)
    monkeypatch.setenv("TMPDIR", str(temp))  # the server's default dump dir is in it
    monkeypatch.delenv("AIOTIMER_DUMP_DIR", raising=False)
    fifo, log, stderr = tmp_path / "t.fifo", tmp_path / "events.jsonl", tmp_path / "stderr"
    options = ("--dump", "--dump-timeout", "0.5", "--event-log", str(log))
    with (
        stderr.open("wb") as err,
        serving(fifo, *options, stderr=err) as server,
        Sentinel() as hung,
    ):
        hung.arm(fifo, after=0.3)
        hung.wait_dead()
        assert hung.proc.wait(BOUND) == -signal.SIGKILL
        server.send_signal(signal.SIGTERM)
        assert server.wait(BOUND) == 0
    warning = stderr.read_text().splitlines()[0]
    assert warning.startswith(
        f"aiotimer serve: warning: --dump: refusing the dump directory {squatted}: it "
        "belongs to uid 65534"
    )
    assert "Set AIOTIMER_DUMP_DIR (or --dump-dir) to a private directory" in warning
    assert list(squatted.iterdir()) == []
    assert hung.reap_latency(events(log)) < 0.5 + 0.5
