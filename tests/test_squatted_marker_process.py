"""A squatted marker never stops ``aiotimer serve``, and clients never trust it.

The server runs without ``CAP_FOWNER`` (``capsh --drop``) in a sticky directory that
belongs to another user, as an unprivileged server runs in ``/tmp``: it cannot remove
or rename over what another user put there. Another user (uid 65534) squats the
marker's path with a forged marker naming a socket of its own. The server serves
without a marker (one error line); a worker's client ignores the forged marker (its
owner is not the FIFO's), never connects to the planted socket, and its hung block is
reaped; ``aiotimer status --fifo`` refuses the marker (exit 3). Then the squatter's file
goes, the server publishes its marker, and the squatter replaces it while the server
runs: the server says so once and keeps serving (it used to exit 1).

Tolerances: every wait is bounded by 15 s; no latency is claimed here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _procs import BOUND, env, sticky_dir_of

pytestmark = [
    pytest.mark.process,
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("capsh") is None,
        reason="needs root and capsh to run a server without CAP_FOWNER",
    ),
]

SQUATTER = 65534

HUNG = r"""
import sys, time
from aiotimer import FifoClient, configure, expires
configure(FifoClient(sys.argv[1]), dump_hook=False)
with expires(after=0.3, scope="hung"):
    print("in", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def sticky() -> Iterator[Path]:
    """A sticky directory of another user (as ``/tmp`` is root's), traversable."""
    with sticky_dir_of(SQUATTER + 1, "aiotimer-squat-") as base:
        yield base


def plant(path: Path, body: dict[str, object]) -> None:
    """A file of the squatter's at ``path`` (made beside it, renamed over it)."""
    beside = path.with_name(path.name + ".planted")
    beside.write_text(json.dumps(body))
    os.chown(beside, SQUATTER, SQUATTER)
    os.replace(beside, path)


def assert_a_hung_worker_is_reaped(fifo: Path) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-c", HUNG, str(fifo)], env=env(), stdout=subprocess.PIPE
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"in\n"
        assert worker.wait(BOUND) == -signal.SIGKILL
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.communicate(timeout=BOUND)


def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {BOUND} s: {what}"
        time.sleep(0.02)


def test_a_squatted_marker_never_stops_the_server_nor_fools_its_clients(sticky: Path) -> None:
    fifo, stderr = sticky / "t.fifo", sticky / "stderr.txt"
    marker = Path(f"{fifo}.aiotimer")
    planted = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    planted.bind(str(sticky / "planted.sock"))
    planted.listen(8)
    planted.settimeout(0.5)
    forged = {"server": "aiotimer", "pid": os.getpid(), "socket": str(sticky / "planted.sock")}
    plant(marker, forged)
    command = " ".join(
        [sys.executable, "-m", "aiotimer", "serve", "--fifo", str(fifo), "--no-control"]
    )
    with stderr.open("wb") as err:
        server = subprocess.Popen(
            ["capsh", "--drop=cap_fowner", "--", "-c", f"exec {command}"],
            env=env(),
            stderr=err,
        )
    try:
        wait_for(lambda: fifo.exists() or server.poll() is not None, "the FIFO")
        assert server.poll() is None, stderr.read_text()
        wait_for(lambda: "serving without a marker" in stderr.read_text(), "the one line")
        assert_a_hung_worker_is_reaped(fifo)  # through the FIFO
        with pytest.raises(TimeoutError):
            planted.accept()  # the forged marker named it: never trusted
        status = subprocess.run(
            [sys.executable, "-m", "aiotimer", "status", "--fifo", str(fifo)],
            env=env(),
            capture_output=True,
            text=True,
            timeout=BOUND,
            check=False,
        )
        assert status.returncode == 3 and "not trusted" in status.stderr, status.stderr
        # The squatter's file goes: the server publishes; then it comes back.
        marker.unlink()
        wait_for(lambda: marker.exists() and marker.stat().st_uid == 0, "the real marker")
        plant(marker, forged)
        wait_for(lambda: stderr.read_text().count("serving without a marker") == 2, "said")
        assert server.poll() is None, "the server stopped over a squatted marker"
        assert_a_hung_worker_is_reaped(fifo)
        server.send_signal(signal.SIGTERM)
        assert server.wait(BOUND) == 0
    finally:
        planted.close()
        if server.poll() is None:
            server.kill()
            server.wait(BOUND)
    said = stderr.read_text()
    assert "Traceback" not in said
    assert json.loads(marker.read_text()) == forged, "the squatter's file is left alone"
