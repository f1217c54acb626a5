"""The ``aiotimer`` command line: argument parsing, and ``serve`` as a real process."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import aiotimer
from aiotimer.cli import COMMANDS, build_parser, main


def test_subcommands_are_registered_in_one_place() -> None:
    assert [c.name for c in COMMANDS] == ["serve", "status", "run", "demo"]
    help_text = build_parser().format_help()
    assert "serve" in help_text


def test_serve_arguments() -> None:
    args = build_parser().parse_args(["serve", "--fifo", "/tmp/x", "--mode", "0620"])
    assert (args.fifo, args.mode, args.loop, args.log_level) == ("/tmp/x", 0o620, "auto", "INFO")
    with pytest.raises(SystemExit) as exc:
        main(["serve"])  # --fifo is required
    assert exc.value.code == 2


@pytest.mark.process
@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("loop", "stop_with"), [("asyncio", signal.SIGINT), ("uvloop", signal.SIGTERM)]
)
def test_serve_runs_until_signalled_and_exits_zero(
    tmp_path: Path, loop: str, stop_with: signal.Signals
) -> None:
    fifo, log = tmp_path / "t.fifo", tmp_path / "events.jsonl"
    argv = [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo)]
    argv += ["--event-log", str(log), "--loop", loop, "--mode", "0620"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    try:
        deadline = time.monotonic() + 15
        while not (fifo.exists() and Path(str(fifo) + ".aiotimer").exists()):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the server did not create its FIFO"
            time.sleep(0.02)
        assert fifo.stat().st_mode & 0o777 == 0o620
        fd = os.open(fifo, os.O_WRONLY)
        os.write(fd, b"garbage\n")
        os.close(fd)
        time.sleep(0.2)
        if loop == "asyncio":  # a second server on the same FIFO is refused, and says why
            second = subprocess.run(
                argv[:6], check=False, capture_output=True, text=True, timeout=20,
                cwd=Path(__file__).parents[1],
            )  # fmt: skip
            assert (second.returncode, proc.poll()) == (1, None)
            assert second.stderr == (
                f"aiotimer serve: error: a live aiotimer server (pid {proc.pid}) already "
                f"serves the FIFO {fifo}; stop it or choose another path\n"
            )
        proc.send_signal(stop_with)
        _, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "timer server started" in stderr and "timer server stopped" in stderr
    assert "rejected input" in stderr
    kinds = [json.loads(line)["event"] for line in log.read_text().splitlines()]
    assert kinds == ["server_started", "request_rejected", "server_stopped"]
    assert not fifo.exists()


@pytest.mark.process
@pytest.mark.timeout(30)
@pytest.mark.process
@pytest.mark.timeout(30)
def test_serve_freezes_its_startup_heap(tmp_path: Path) -> None:
    """Once serving, the start-up objects are out of the collector's reach (a full
    pass that scans them stops the loop for tens of milliseconds)."""
    fifo = tmp_path / "timer.fifo"
    marker = Path(f"{fifo}.aiotimer")
    frozen: list[int] = []

    def watch() -> None:
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        deadline = time.monotonic() + 5  # serving: the freeze follows start-up at once
        while not gc.get_freeze_count() and time.monotonic() < deadline:
            time.sleep(0.01)
        frozen.append(gc.get_freeze_count())
        os.kill(os.getpid(), signal.SIGTERM)  # the server's own way to stop

    assert gc.get_freeze_count() == 0
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        code = main(["serve", "--fifo", str(fifo), "--no-control", "--no-journal"])
    finally:
        watcher.join()
        gc.unfreeze()
    assert code == 0
    assert frozen and frozen[0] > 1000


def test_serve_refuses_a_path_that_is_not_a_fifo(tmp_path: Path) -> None:
    path = tmp_path / "regular"
    path.write_text("do not clobber me")
    argv = [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(path)]
    proc = subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=20, cwd=Path(__file__).parents[1]
    )
    assert proc.returncode == 1
    assert "aiotimer serve:" in proc.stderr
    assert path.read_text() == "do not clobber me"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"aiotimer {aiotimer.__version__}\n"
