"""Helpers of the real-process tests of ``aiotimer serve`` under faults and floods.

A *sentinel* is a real process (``sleep``) with one timer on the server. Its reap
latency (deadline to signal sent, the figure the project's benchmarks report) is read
from the event log: the ``worker_reaped`` record's time against the deadline the
sentinel's line carried. The test also sees the process die, through a pidfd; on a
loaded machine the test process itself may be scheduled late, so that moment bounds
the latency only loosely.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
#: The bound on waits for something that should happen within a fraction of a second.
BOUND = 15.0


def serve_argv(fifo: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo), *options]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def wait_for_marker(server: subprocess.Popen[Any], fifo: Path) -> None:
    marker = Path(f"{fifo}.aiotimer")
    deadline = time.monotonic() + BOUND
    while not (fifo.exists() and marker.exists()):
        assert server.poll() is None, f"the server exited with {server.returncode}"
        assert time.monotonic() < deadline, "the server did not create its FIFO"
        time.sleep(0.01)


@contextmanager
def serving(
    fifo: Path,
    *options: str,
    stderr: int | IO[Any] | None = subprocess.DEVNULL,
    preexec: Any = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """``aiotimer serve`` on ``fifo`` until the block ends (then SIGKILL if still up)."""
    server = subprocess.Popen(
        serve_argv(fifo, *options),
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=env(),
        preexec_fn=preexec,  # noqa: PLW1509 (sets a limit; the test has no threads yet)
    )
    try:
        wait_for_marker(server, fifo)
        yield server
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate(timeout=BOUND)


def status_until(fifo: Path, done: Callable[[dict[str, Any]], Any], what: str) -> Any:
    """Run ``aiotimer status --json`` on ``fifo`` until ``done(document)`` is truthy, and
    return that (fails with ``what`` after ``BOUND`` seconds)."""
    deadline = time.monotonic() + BOUND
    while True:
        status = subprocess.run(
            [sys.executable, "-m", "aiotimer", "status", "--fifo", str(fifo), "--json"],
            env=env(),
            capture_output=True,
            timeout=BOUND,
            check=False,
        )
        if status.returncode == 0 and (found := done(json.loads(status.stdout))):
            return found
        assert time.monotonic() < deadline, f"{what}: {status.stderr!r}"
        time.sleep(0.05)


def line(pid: int, scope: str, after: float, sig: int = 9) -> bytes:
    """A torch-format acquire line (plus ``mono``) expiring ``after`` seconds from now."""
    body = {
        "version": 1,
        "pid": pid,
        "scope_id": scope,
        "expiration_time": time.time() + after,
        "signal": sig,
        "mono": time.monotonic() + after,
    }
    return json.dumps(body).encode() + b"\n"


def send(fifo: Path, data: bytes) -> None:
    """Write ``data`` to the FIFO (blocking, whole)."""
    fd = os.open(fifo, os.O_WRONLY)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class Sentinel:
    """A sleeping process with a pidfd, to time the signal that ends it."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["sleep", "300"])
        self.pid = self.proc.pid
        self.pidfd = os.pidfd_open(self.pid)
        self.deadline: float | None = None
        self.wall_deadline: float | None = None

    def arm(self, fifo: Path, after: float, scope: str = "sentinel") -> None:
        """Send its timer: SIGKILL ``after`` seconds from now."""
        data = line(self.pid, scope, after)
        body = json.loads(data)
        self.deadline, self.wall_deadline = body["mono"], body["expiration_time"]
        send(fifo, data)

    def reap_latency(self, records: Sequence[dict[str, Any]]) -> float:
        """Seconds from its deadline to the server's signal, from the event log."""
        assert self.wall_deadline is not None
        sent = [
            r["time"] for r in records if r["event"] == "worker_reaped" and r["pid"] == self.pid
        ]
        assert sent, f"no kill record for sentinel {self.pid}"
        return float(sent[0]) - self.wall_deadline

    def wait_dead(self, timeout: float = BOUND) -> float:
        """Wait for its death (fail if it does not come); when it was seen."""
        ready, _, _ = select.select([self.pidfd], [], [], timeout)
        seen = time.monotonic()
        assert ready, f"the sentinel was not reaped within {timeout} s"
        return seen

    def lateness(self, timeout: float = BOUND) -> float:
        """Seconds from its deadline to its death as this process saw it (fails if it is
        still alive)."""
        assert self.deadline is not None
        return self.wait_dead(timeout) - self.deadline

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.pidfd)

    def __enter__(self) -> Sentinel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def events(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of an event log."""
    out = []
    for raw in path.read_bytes().splitlines():
        try:
            out.append(json.loads(raw))
        except ValueError:
            continue
    return out


def kinds(records: Sequence[dict[str, Any]]) -> list[str]:
    return [r["event"] for r in records]


@contextmanager
def sticky_dir_of(uid: int, prefix: str) -> Iterator[Path]:
    """A sticky directory (as ``/tmp`` is root's) owned by ``uid``, traversable by all:
    what one user may not remove or rename over there is another's (needs root)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o1777)
    os.chown(base, uid, uid)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
