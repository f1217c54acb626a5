"""Ctrl-C at any moment of any command, and bad input: one line, never a traceback.

Ctrl-C is sent as a terminal sends it, to the command's whole process group (the
command runs in a session of its own). The first moment is while the command's modules
load: the test waits until the process has mapped ``_lzma``, which building the command
line's parser loads (argparse's help formatter imports ``shutil``) and the bare package
does not (a subcommand's own modules load after it, when it is parsed); the later
moments are counted from then. (The
interpreter's start and the import of the ``aiotimer`` package itself, ~0.1 s on an idle
machine, run before any code of the command can: a Ctrl-C there is Python's.)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._procs import BOUND, env

pytestmark = pytest.mark.process


def _start(*argv: str, cwd: Path) -> subprocess.Popen[str]:
    (cwd / "ev.jsonl").write_text("")  # what status --event-log watches
    return subprocess.Popen(
        [sys.executable, "-m", "aiotimer", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=cwd,
        start_new_session=True,
    )


def _aiotimer(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiotimer", *argv],
        check=False,
        capture_output=True,
        text=True,
        env=env(),
        cwd=cwd,
        timeout=BOUND * 2,
    )


def _loading(proc: subprocess.Popen[str]) -> None:
    """Wait until ``proc`` is loading the command line's modules."""
    deadline = time.monotonic() + BOUND
    while "_lzma" not in Path(f"/proc/{proc.pid}/maps").read_text():
        assert proc.poll() is None, "the command ended before it built its parser"
        assert time.monotonic() < deadline, "the command did not build its parser"
        time.sleep(0.001)


def _interrupt(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGINT to ``proc``'s group; its exit status as a shell shows it, and its stderr.

    A death by SIGINT counts as 130, as a shell shows it: CPython 3.11 ends a process that
    caught a KeyboardInterrupt raised inside code it ran through its own eval (a dataclass
    being made while a module loads) by SIGINT at exit, whatever the exit status given.
    """
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=BOUND)
    code = proc.returncode
    return (128 + signal.SIGINT if code == -signal.SIGINT else code), err


COMMANDS = [
    ("serve", "--fifo", "t.fifo"),
    ("run", "--", sys.executable, "-c", "import time; time.sleep(30)"),
    ("status", "--event-log", "ev.jsonl", "--watch", "0.2"),
    ("demo",),
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_ctrl_c_while_loading_exits_130_quietly(argv: tuple[str, ...], tmp_path: Path) -> None:
    proc = _start(*argv, cwd=tmp_path)
    _loading(proc)
    code, err = _interrupt(proc)
    assert code == 130, err
    assert "Traceback" not in err


@pytest.mark.parametrize("delay", [0.5, 2.0])
@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: a[0])
def test_ctrl_c_later_is_quiet(argv: tuple[str, ...], delay: float, tmp_path: Path) -> None:
    proc = _start(*argv, cwd=tmp_path)
    _loading(proc)  # past the package's own import, which no entry point can cover
    time.sleep(delay)
    code, err = _interrupt(proc)
    # serve and status --watch end at 0 on SIGINT; an interrupted run or demo exits 130
    # (so does any command still loading).
    assert code in (0, 130), err
    assert "Traceback" not in err
    assert "KeyboardInterrupt" not in err


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (("serve", "--fifo", ""), "--fifo"),
        (("status", "--fifo", "t.fifo", "--timeout", "-1"), "--timeout"),
        (("status", "--fifo", "t.fifo", "--timeout", "nan"), "--timeout"),
        (("status", "--fifo", "t.fifo", "--watch", "0"), "--watch"),
        (("status", "--control", ""), "--control"),
        (("status", "--event-log", ""), "--event-log"),
        (("run", "--dump-dir", "", "--", "true"), "--dump-dir"),
        (("run", "--restart-window", "0", "--", "true"), "--restart-window"),
        (("run", "--restart-scope", "job", "--", "true"), "--restart-scope job"),
        (("run", "--on-straggler", "kill", "--", "true"), "--on-straggler"),
        (("run", "--control", "regular", "--", "true"), "--control"),
        (("run", "--control", "missing/dir/ctl.sock", "--", "true"), "--control"),
        (("run", "--control", "", "--", "true"), "--control"),
        (("run", "--no-restart-exit-code", "256", "--", "true"), "--no-restart-exit-code"),
        (("serve", "--fifo", "f", "--etcd", "h:1", "--job", "j", "--etcd-ttl", "0"), "--etcd-ttl"),
    ],
)
def test_bad_input_is_one_line_naming_the_argument(
    argv: tuple[str, ...], names: str, tmp_path: Path
) -> None:
    (tmp_path / "regular").write_text("")
    proc = _aiotimer(*argv, cwd=tmp_path)
    usage = 4 if argv[0] == "status" else 2  # status: the LSB's codes
    assert proc.returncode == usage, proc.stderr
    assert names in proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "started" not in proc.stderr  # no worker, no server was started
    assert sorted(p.name for p in tmp_path.iterdir()) == ["regular"]  # nothing created


def test_a_budget_without_window_counts_every_restart(tmp_path: Path) -> None:
    proc = _aiotimer(
        "run", "--restart-window", "inf", "--max-restarts", "1", "--backoff", "0",
        "--min-uptime", "0", "--", sys.executable, "-c", "import sys; sys.exit(1)",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr  # gave up
    assert proc.stderr.count("worker 0 started") == 2
    assert "restart budget exhausted (1 restart(s))" in proc.stderr


HANG_ONCE = """
import os, sys, time
from aiotimer import expires
with expires(after=0.5, scope="step"):
    if os.environ["AIOTIMER_RESTART_COUNT"] == "0":
        time.sleep(60)
"""


def test_what_happened_in_a_run_that_has_ended(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    run = _aiotimer(
        "run", "--event-log", str(log), "--backoff", "0", "--",
        sys.executable, "-c", HANG_ONCE, cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "reaped, restarted, then succeeded (exit code 0)" in run.stderr  # final table
    assert "(+1 earlier)" not in run.stderr
    status = _aiotimer("status", "--event-log", str(log), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    text = status.stdout
    assert "reaped, restarted, then succeeded (exit code 0)" in text
    [first] = [line for line in text.splitlines() if "rank 0 attempt 1" in line]
    assert "reaped (SIGKILL): block 'step' outlived its timer" in first
    assert "after its reap deadline" in first  # how late
    assert "restart 1 of 3 allowed): after worker 0 reaped" in text  # the restart's cause
    assert "rank 0: timer 'step' of worker" in text  # the live status's block
    assert text.endswith("outcome: succeeded (exit code 0)\n")


def test_a_live_control_socket_is_refused_before_anything_starts(tmp_path: Path) -> None:
    private = tmp_path / "ctl"
    private.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(private / "http.sock"))
        live.listen()
        proc = _aiotimer("run", "--control", str(private / "http.sock"), "--", "true", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "another server listens on the control socket" in proc.stderr
    assert "started" not in proc.stderr
