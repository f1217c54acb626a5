"""Another user cannot switch the journal off, and a server that cannot journal says so.

In a sticky directory of another user (as ``/tmp`` is root's), another user (uid 65534)
plants a file at ``<fifo>.journal`` before the server starts. A worker that registered
and hung is still reaped by a server restarted after a SIGKILL of the first:

* a server that may override the sticky bit (root) takes the path back with a rename
  (the planted file is never read or written);
* a server that may not (run without ``CAP_FOWNER``, like an unprivileged server in
  ``/tmp``) journals in a private directory of its user (``$XDG_RUNTIME_DIR``, here a
  directory of the test's), and says so in one line.

When that directory cannot be used either, the server cannot journal: it says so in one
error line, however often it tries, and ``aiotimer status`` shows it, in its text and in
its JSON.

Tolerances: every wait is bounded by 15 s; no latency is claimed here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _procs import BOUND, env, line, send, serve_argv, sticky_dir_of

pytestmark = [
    pytest.mark.process,
    pytest.mark.timeout(90),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a file of uid 65534"),
]

SQUATTER = 65534

HUNG = r"""
import sys, time
from aiotimer import FifoClient, configure, expires
configure(FifoClient(sys.argv[1]), dump_hook=False)
with expires(after=8, scope="hung"):
    print("in", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A sticky directory of another user, traversable by all."""
    with sticky_dir_of(SQUATTER + 1, "aiotimer-jsquat-") as base:
        yield base


def plant(path: Path) -> None:
    """A file of the squatter's at ``path``."""
    path.write_text('{"planted": true}')
    os.chown(path, SQUATTER, SQUATTER)


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"not within {BOUND} s: {what}"
        time.sleep(0.02)


def start(argv: list[str], stderr: Path, runtime: Path) -> subprocess.Popen[bytes]:
    """A server (``argv``) whose per-user runtime directory is ``runtime``."""
    with stderr.open("ab") as err:
        return subprocess.Popen(
            argv,
            env={**env(), "XDG_RUNTIME_DIR": str(runtime)},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def without_fowner(argv: list[str]) -> list[str]:
    return ["capsh", "--drop=cap_fowner", "--", "-c", f"exec {' '.join(argv)}"]


needs_capsh = pytest.mark.skipif(
    shutil.which("capsh") is None, reason="needs capsh to drop CAP_FOWNER"
)


def journaled_pids(path: Path) -> set[int]:
    try:
        st = os.lstat(path)
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return set()
    if st.st_uid != os.geteuid() or "entries" not in body:
        return set()
    return {entry["pid"] for entry in body["entries"]}


def stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.kill()
    server.wait(BOUND)


@pytest.mark.parametrize("privileged", [True, pytest.param(False, marks=needs_capsh)])
def test_a_planted_journal_does_not_stop_a_restart_reaping_the_hung(
    sticky: Path, tmp_path: Path, privileged: bool
) -> None:
    fifo, stderr, runtime = sticky / "t.fifo", sticky / "stderr.txt", tmp_path / "run"
    runtime.mkdir(mode=0o700)
    journal = Path(f"{fifo}.journal")
    plant(journal)
    argv = serve_argv(fifo, "--no-control")
    argv = argv if privileged else without_fowner(argv)

    def journaled() -> set[int]:
        return set().union(*map(journaled_pids, [journal, *runtime.glob("*/*.journal")]))

    first = start(argv, stderr, runtime)
    worker = None
    try:
        wait_for(lambda: Path(f"{fifo}.aiotimer").exists() or first.poll() is not None, "FIFO")
        assert first.poll() is None, stderr.read_text()
        worker = subprocess.Popen(
            [sys.executable, "-c", HUNG, str(fifo)], env=env(), stdout=subprocess.PIPE
        )
        assert worker.stdout is not None and worker.stdout.readline() == b"in\n"
        wait_for(lambda: worker.pid in journaled(), "the worker journaled")
        first.kill()
        first.wait(BOUND)
        assert worker.poll() is None, "reaped by the first server: the test proves nothing"
        second = start(argv, stderr, runtime)
        try:
            assert worker.wait(BOUND) == -signal.SIGKILL, "the restarted server never reaped"
        finally:
            stop(second)
    finally:
        stop(first)
        if worker is not None:
            if worker.poll() is None:
                worker.kill()
            worker.communicate(timeout=BOUND)
    said = stderr.read_text()
    assert "Traceback" not in said
    assert said.count("journaling to") == (0 if privileged else 2), said  # once per server
    assert (journal.stat().st_uid == 0) is privileged


@needs_capsh
def test_a_server_that_cannot_journal_says_so_once_and_in_status(
    sticky: Path, tmp_path: Path
) -> None:
    fifo, stderr = sticky / "t.fifo", sticky / "stderr.txt"
    plant(Path(f"{fifo}.journal"))
    # No private directory to journal in either: the runtime directory is missing.
    server = start(without_fowner(serve_argv(fifo)), stderr, tmp_path / "missing")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        wait_for(lambda: "cannot write journal" in stderr.read_text(), "the one line")
        for n in range(3):  # changes to write, over more than two retries
            send(fifo, line(sleeper.pid, f"s{n}", 60.0))
            time.sleep(1.0)
        assert stderr.read_text().count("cannot write journal") == 1, stderr.read_text()

        def status(*options: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "aiotimer", "status", "--fifo", str(fifo), *options],
                env=env(),
                capture_output=True,
                text=True,
                timeout=BOUND,
                check=True,
            )
            return done.stdout

        assert "JOURNAL NOT WRITTEN" in status()
        problem = json.loads(status("--json"))["server"]["journal_problem"]
        assert "uid 65534" in problem or "Operation not permitted" in problem, problem
        assert server.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
        stop(server)
    assert "Traceback" not in stderr.read_text()
