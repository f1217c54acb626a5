"""The servers under test, each started in its own process, and each one's own client.

* ``aiotimer``: ``aiotimer serve --fifo PATH`` (a subprocess, default settings); workers
  use ``expires_at()`` over a ``FifoClient`` (one persistent descriptor).
* ``torch-file-<max_interval>``: torch's ``FileTimerServer`` in a spawned process, at its
  default ``max_interval`` (10 s) and at the 0.1 s torch's elastic agent uses; workers
  use torch's ``FileTimerClient`` (open, write, close per request). torch 2.13's server
  signals its *own* process after every reap (it would kill itself at the first hang);
  the harness suppresses exactly that one self-signal and changes nothing else.
* ``torch-local-0.1``: torch's ``LocalTimerServer`` over a ``multiprocessing.Queue``
  (``LocalTimerClient`` in the workers), at ``max_interval=0.1`` (its default, 60 s,
  would make a run last minutes). It reaps with ``SIGKILL`` only, so its first-signal
  time is not observable: its latency is taken at the exit (see ``latency_basis``).
  Seen here: it SIGKILLs an ingest probe (an acquire already expired on arrival) while
  that worker's queue feeder thread still holds the queue's shared write lock; the lock
  dies with the process (its value stays 0 after every worker is gone), and from then
  on no worker's request reaches the server: its missed reaps and false kills.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import logging
import multiprocessing
import multiprocessing.synchronize
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiotimer import AiotimerError, FifoClient, expires_at
from benchmarks.many_workers.worker import REAP_SIGNAL, Sender

__all__ = ["SPECS", "RunningServer", "ServerSpec", "make_sender", "start_server", "torch_version"]

_spawn = multiprocessing.get_context("spawn")
#: An aiotimer server publishes this file beside its FIFO once it serves (documented
#: with ``FifoClient``).
MARKER_SUFFIX = ".aiotimer"
START_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One server configuration of the comparison."""

    name: str
    kind: str  # "aiotimer" | "torch-file" | "torch-local"
    max_interval: float = 0.0  # torch's polling interval

    @property
    def needs_torch(self) -> bool:
        return self.kind != "aiotimer"

    @property
    def latency_basis(self) -> str:
        """``"signal"``: reap latency is taken at the first signal; ``"exit"``: at exit."""
        return "exit" if self.kind == "torch-local" else "signal"

    @property
    def miss_window(self) -> float:
        """Seconds after a deadline by which a hang must be reaped, else it is missed:
        the server's polling interval plus 5 s (torch's file server also sleeps up to
        1 s at EOF)."""
        return self.max_interval + 5.0


SPECS: tuple[ServerSpec, ...] = (
    ServerSpec("aiotimer", "aiotimer"),
    ServerSpec("torch-file-0.1", "torch-file", 0.1),
    ServerSpec("torch-file-10", "torch-file", 10.0),
    ServerSpec("torch-local-0.1", "torch-local", 0.1),
)


def torch_version() -> str | None:
    """torch's installed version, else None (found without importing it: the harness
    never needs torch in its own process)."""
    if importlib.util.find_spec("torch") is None:
        return None
    return importlib.metadata.version("torch")


class RunningServer:
    """A started server: its pid (for CPU/RSS), what its workers' client needs
    (:func:`make_sender` arguments), and ``wait_ready()``/``stop()``."""

    def __init__(
        self,
        pid: int,
        client: tuple[str, Any],
        wait_ready: Callable[[], None],
        stop: Callable[[], None],
    ) -> None:
        self.pid = pid
        self.client = client
        self.wait_ready = wait_ready
        self.stop = stop


def make_sender(kind: str, target: Any) -> Sender:
    """The client of a ``kind`` server at ``target`` (a FIFO path or a queue)."""
    if kind == "aiotimer":
        return _AiotimerSender(target)
    if kind == "torch-file":
        return _TorchFileSender(target)
    return _TorchLocalSender(target)


def _wait_for(check: Callable[[], bool], what: str, alive: Callable[[], bool]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not check():
        if not alive():
            raise RuntimeError(f"{what}: the server process exited during start-up")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready within {START_TIMEOUT:.0f} s")
        time.sleep(0.02)


def start_server(
    spec: ServerSpec,
    workdir: str,
    log_path: str,
    *,
    profile: str | None = None,
    aiotimer_args: Sequence[str] = (),
) -> RunningServer:
    """Start ``spec`` in its own process, with its FIFO/queue under ``workdir`` (and
    aiotimer's stderr in ``log_path``); it serves once ``wait_ready()`` returns.
    ``profile``: run aiotimer's server under :mod:`cProfile`, writing to this file;
    ``aiotimer_args``: more ``aiotimer serve`` options (e.g. ``--no-journal``)."""
    if spec.kind == "aiotimer":
        fifo = os.path.join(workdir, "aiotimer.fifo")
        return _start_aiotimer(fifo, log_path, profile, aiotimer_args)
    if spec.kind == "torch-file":
        return _start_torch_file(os.path.join(workdir, "torch.fifo"), spec.max_interval)
    return _start_torch_local(spec.max_interval)


# -- aiotimer ---------------------------------------------------------------------------


class _AiotimerSender:
    def __init__(self, path: str) -> None:
        self._client = FifoClient(path, signal=REAP_SIGNAL)
        self._blocks: dict[str, Any] = {}

    def acquire(self, scope: str, deadline: float) -> bool:
        block = expires_at(deadline, scope=scope, client=self._client)
        try:
            block.__enter__()
        except AiotimerError:
            return False
        self._blocks[scope] = block
        return True

    def release(self, scope: str) -> bool:
        block = self._blocks.pop(scope)
        try:
            block.__exit__(None, None, None)
        except AiotimerError:
            return False
        return True

    def finish(self) -> None:
        self._client.close()


def _start_aiotimer(
    path: str, log_path: str, profile: str | None, extra: Sequence[str]
) -> RunningServer:
    log = open(log_path, "wb")  # noqa: SIM115
    profiler = [] if profile is None else ["-m", "cProfile", "-o", profile]
    serve = ["-m", "aiotimer", "serve", "--fifo", path, "--log-level", "WARNING", *extra]
    proc = subprocess.Popen(
        [sys.executable, *profiler, *serve],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()

    def stop() -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def wait_ready() -> None:
        _wait_for(
            lambda: os.path.exists(path + MARKER_SUFFIX),
            "aiotimer serve",
            lambda: proc.poll() is None,
        )

    return RunningServer(proc.pid, ("aiotimer", path), wait_ready, stop)


# -- torch ------------------------------------------------------------------------------


def _quiet_torch() -> None:
    # torch's client logs a traceback per failed open; the counts say it instead.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)


class _TorchFileSender:
    def __init__(self, path: str) -> None:
        from torch.distributed.elastic.timer import FileTimerClient  # noqa: PLC0415

        _quiet_torch()
        self._client = FileTimerClient(path, signal=REAP_SIGNAL)
        self._wall_offset = time.time() - time.monotonic()

    def acquire(self, scope: str, deadline: float) -> bool:
        try:
            self._client.acquire(scope, deadline + self._wall_offset)
        except OSError:  # BlockingIOError on a full pipe, BrokenPipeError without reader
            return False
        return True

    def release(self, scope: str) -> bool:
        try:
            self._client.release(scope)
        except OSError:
            return False
        return True

    def finish(self) -> None:
        pass


def _serve_torch_file(
    path: str, max_interval: float, ready: multiprocessing.synchronize.Event
) -> None:
    from torch.distributed.elastic.timer import FileTimerServer  # noqa: PLC0415

    class NoSelfSignal(FileTimerServer):  # type: ignore[misc]
        def _reap_worker(self, worker_pid: int, signal: int) -> bool:
            if worker_pid == os.getpid():  # torch signals itself after each reap
                return True
            return bool(super()._reap_worker(worker_pid, signal))

    _quiet_torch()
    server = NoSelfSignal(path, run_id="bench", max_interval=max_interval)
    server.start()
    ready.set()
    signal.pause()  # until the harness kills this process


def _stop_process(proc: multiprocessing.process.BaseProcess) -> Callable[[], None]:
    def stop() -> None:
        proc.kill()  # torch's servers keep nothing worth a graceful stop
        proc.join(10)
        with contextlib.suppress(ValueError):
            proc.close()

    return stop


def _start_torch_file(path: str, max_interval: float) -> RunningServer:
    ready = _spawn.Event()
    proc = _spawn.Process(target=_serve_torch_file, args=(path, max_interval, ready), daemon=True)
    proc.start()
    assert proc.pid is not None
    return RunningServer(
        proc.pid,
        ("torch-file", path),
        lambda: _wait_for(ready.is_set, "torch FileTimerServer", proc.is_alive),
        _stop_process(proc),
    )


class _TorchLocalSender:
    def __init__(self, queue: Any) -> None:
        from torch.distributed.elastic.timer import LocalTimerClient  # noqa: PLC0415

        self._queue = queue
        self._client = LocalTimerClient(queue)
        self._wall_offset = time.time() - time.monotonic()

    def acquire(self, scope: str, deadline: float) -> bool:
        self._client.acquire(scope, deadline + self._wall_offset)
        return True

    def release(self, scope: str) -> bool:
        self._client.release(scope)
        return True

    def finish(self) -> None:
        self._queue.close()
        self._queue.join_thread()  # the queue's feeder thread flushes the last releases


def _serve_torch_local(
    queue: Any, max_interval: float, ready: multiprocessing.synchronize.Event
) -> None:
    from torch.distributed.elastic.timer import LocalTimerServer  # noqa: PLC0415

    _quiet_torch()
    server = LocalTimerServer(queue, max_interval=max_interval)
    server.start()
    ready.set()
    signal.pause()


def _start_torch_local(max_interval: float) -> RunningServer:
    queue = _spawn.Queue()
    ready = _spawn.Event()
    proc = _spawn.Process(target=_serve_torch_local, args=(queue, max_interval, ready), daemon=True)
    proc.start()
    assert proc.pid is not None
    stop_proc = _stop_process(proc)

    def stop() -> None:
        stop_proc()
        queue.close()
        queue.cancel_join_thread()

    return RunningServer(
        proc.pid,
        ("torch-local", queue),
        lambda: _wait_for(ready.is_set, "torch LocalTimerServer", proc.is_alive),
        stop,
    )
