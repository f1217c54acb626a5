"""No other user ever reads the FIFO: ``aiotimer serve --mode`` refuses read bits for
group and others.

A reader of the FIFO takes the lines it reads away from the server: a stolen acquire
is a hang never reaped, a stolen release a healthy worker killed. ``--mode 0666``,
``0644`` and ``0640`` are usage errors (exit 2, one line naming ``--mode``) and leave no
FIFO behind; ``--mode 0622`` (others may write, as warned) serves a FIFO without read
bits for group or others, which a process of another uid (65534) cannot open for
reading.

Tolerances: every wait is bounded by 15 s; no latency is claimed here.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _procs import BOUND, env, serve_argv, serving

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

OTHER = 65534

#: Run as root, drops to uid ``OTHER`` and tries to open the FIFO for reading.
READ_AS_OTHER = f"""
import os, sys
os.setgid({OTHER})
os.setuid({OTHER})
try:
    fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
except PermissionError:
    print("refused")
else:
    os.close(fd)
    print("opened")
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may enter and write to, as ``/tmp`` (sticky)."""
    base = Path(tempfile.mkdtemp(prefix="aiotimer-mode-"))
    base.chmod(0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("mode", ["0666", "0644", "0640"])
def test_a_mode_others_may_read_is_refused_in_one_line(shared: Path, mode: str) -> None:
    fifo = shared / "t.fifo"
    run = subprocess.run(
        serve_argv(fifo, "--mode", mode, "--no-control"),
        env=env(),
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert run.returncode == 2, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "--mode" in lines[0] and "read" in lines[0], run.stderr
    assert not fifo.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process of uid 65534")
def test_a_fifo_others_may_write_stays_unreadable_to_them(shared: Path) -> None:
    fifo = shared / "t.fifo"
    with serving(fifo, "--mode", "0622", "--no-control") as server:
        assert stat.S_IMODE(fifo.stat().st_mode) & 0o044 == 0
        tried = subprocess.run(
            [sys.executable, "-c", READ_AS_OTHER, str(fifo)],
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=True,
        )
        assert tried.stdout.strip() == "refused", tried.stderr
        assert server.poll() is None
