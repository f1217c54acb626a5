"""Wire interoperability with the real torch package, in both directions.

1. torch's ``FileTimerClient`` and ``expires()`` (in worker processes) against aiotimer's
   FIFO server.
2. aiotimer's FIFO client (``aiotimer.client.expires``, found through
   ``TORCHELASTIC_TIMER_FILE``) against torch's ``FileTimerServer``. torch 2.13's server
   signals its own process after a reap, so it runs in a child process that is expected
   to die, never in the pytest process.
3. torch's ``LocalTimerClient`` over a ``multiprocessing.Queue`` against aiotimer's queue
   source, and aiotimer's compat ``LocalTimerClient`` against torch's ``LocalTimerServer``.

Workers are forked from the pytest process (torch is already imported, so they start in
milliseconds). Tolerances: a stuck worker must be gone within ``WAIT`` seconds of a
sub-second deadline; what matters is *whether* it is killed, not how fast.
"""

from __future__ import annotations

import importlib
import inspect
import math
import multiprocessing
import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch_timer = pytest.importorskip("torch.distributed.elastic.timer")

import aiotimer.compat.torch as compat  # noqa: E402
from aiotimer.client import FifoClient, expires  # noqa: E402
from aiotimer.events import Event, WorkerReaped  # noqa: E402
from aiotimer.server import TimerServer, TimerServerThread  # noqa: E402
from aiotimer.wire import TORCH_ENV_FIFO  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.process, pytest.mark.timeout(60)]

FORK = multiprocessing.get_context("fork")
#: Generous bound for a worker to be killed (or to finish) on a busy 2-core machine.
WAIT = 15.0


def join(p: Any, timeout: float = WAIT) -> int | None:
    p.join(timeout)
    if p.exitcode is None:  # still running: the assertion will fail; do not leak it
        p.kill()
        p.join()
    code: int | None = p.exitcode
    return code


@pytest.fixture
def fifo(tmp_path: Path) -> str:
    return str(tmp_path / "timer.fifo")


@pytest.fixture
def reaped() -> list[Event]:
    return []


@pytest.fixture
def aiotimer_fifo_server(fifo: str, reaped: list[Event]) -> Iterator[str]:
    def record(event: Event) -> None:
        if isinstance(event, WorkerReaped):
            reaped.append(event)

    with TimerServerThread(TimerServer(fifo=fifo, on_event=record)):
        yield fifo


# -- the same module paths as torch ----------------------------------------------------------

TORCH_PACKAGE = "torch.distributed.elastic.timer"


@pytest.mark.parametrize(
    "submodule", ["", ".api", ".local_timer", ".file_based_local_timer", ".debug_info_logging"]
)
def test_every_torch_module_path_has_its_compat_twin(submodule: str) -> None:
    """Each torch module's ``__all__``, and every API name it imports from the timer
    package, is importable from the compat module of the same path (so one line of
    imports switches), as the same kind of object."""
    theirs = importlib.import_module(TORCH_PACKAGE + submodule)
    ours = importlib.import_module("aiotimer.compat.torch" + submodule)
    api_names = {
        name
        for name, value in vars(theirs).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith(TORCH_PACKAGE)
        and not inspect.ismodule(value)
    }
    wanted = set(getattr(theirs, "__all__", ())) | api_names
    assert wanted <= set(ours.__all__), sorted(wanted - set(ours.__all__))
    for name in wanted:
        mine, torchs = getattr(ours, name), getattr(theirs, name)
        assert inspect.isclass(mine) == inspect.isclass(torchs), name
        assert callable(mine), name
        assert mine.__doc__, name


# -- requests: the same bytes as torch -----------------------------------------------------


@pytest.mark.parametrize(
    ("pid", "scope", "expiration", "sig"),
    [
        (4242, "train.py#42", 1763712000.25, 9),
        (1, 'ünïcode "scope"\n', 0, 0),
        (2**31 - 1, "s", -1, 0),
        (7, "x", 12345678901234, -15),
        (7, "x", 1e-7, 15),
    ],
)
def test_file_timer_request_to_json_is_byte_identical(
    pid: int, scope: str, expiration: float, sig: int
) -> None:
    ours = compat.FileTimerRequest(pid, scope, expiration, sig)
    theirs = torch_timer.FileTimerRequest(pid, scope, expiration, sig)
    assert ours.to_json() == theirs.to_json()


# -- 1. torch's clients against aiotimer's FIFO server ------------------------------------


def _torch_stuck(path: str) -> None:
    torch_timer.configure(torch_timer.FileTimerClient(path))
    with torch_timer.expires(after=0.3):
        time.sleep(WAIT * 2)


def _torch_released(path: str) -> None:
    client = torch_timer.FileTimerClient(path)
    with torch_timer.expires(after=0.3, client=client):
        pass
    time.sleep(1.0)  # well past the released deadline


def _torch_raw_client(path: str) -> None:
    client = torch_timer.FileTimerClient(path, signal=signal.SIGTERM)
    client.acquire("raw", time.time() + 0.2)
    time.sleep(WAIT * 2)


def test_torch_file_client_against_aiotimer_server(
    aiotimer_fifo_server: str, reaped: list[Event]
) -> None:
    stuck = FORK.Process(target=_torch_stuck, args=(aiotimer_fifo_server,))
    released = FORK.Process(target=_torch_released, args=(aiotimer_fifo_server,))
    raw = FORK.Process(target=_torch_raw_client, args=(aiotimer_fifo_server,))
    for p in (stuck, released, raw):
        p.start()
    assert join(stuck) == -signal.SIGKILL
    assert join(raw) == -signal.SIGTERM  # the signal torch's client asked for
    assert join(released) == 0
    assert {e.pid for e in reaped if isinstance(e, WorkerReaped)} == {stuck.pid, raw.pid}


# -- 2. aiotimer's FIFO client against torch's FileTimerServer ----------------------------


def _torch_server(path: str) -> None:
    """Run torch's FileTimerServer until it kills itself after a reap (torch 2.13)."""
    server = torch_timer.FileTimerServer(path, "interop", max_interval=0.05)
    server.start()
    time.sleep(WAIT * 2)
    server.stop()


def _aiotimer_worker(path: str, after: float, work: float) -> None:
    os.environ[TORCH_ENV_FIFO] = path  # discovered as under torchrun
    with expires(after=after):
        time.sleep(work)
    time.sleep(max(0.0, after - work) + 1.0)  # past the deadline: must not be killed


def test_aiotimer_client_against_torch_server(fifo: str) -> None:
    server = FORK.Process(target=_torch_server, args=(fifo,))
    server.start()
    try:
        end = time.monotonic() + WAIT
        while not (os.path.exists(fifo) and stat.S_ISFIFO(os.stat(fifo).st_mode)):
            assert time.monotonic() < end, "torch's server did not create its FIFO"
            time.sleep(0.01)
        # The released worker keeps its client (and would keep a persistent descriptor)
        # alive while the stuck one waits for its deadline: torch's server reads with a
        # blocking readline(), so it would never reap while a writer holds the FIFO open.
        released = FORK.Process(target=_aiotimer_worker, args=(fifo, 1.5, 0.0))
        released.start()
        time.sleep(0.2)
        stuck = FORK.Process(target=_aiotimer_worker, args=(fifo, 0.5, WAIT * 2))
        stuck.start()
        assert join(stuck) == -signal.SIGKILL
        assert join(released) == 0
        # torch 2.13 then signals its own process with the same signal.
        assert join(server) == -signal.SIGKILL
    finally:
        if server.exitcode is None:
            server.kill()
            server.join()


def test_aiotimer_client_uses_per_request_descriptors_without_the_marker(fifo: str) -> None:
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        client = FifoClient(fifo)
        with expires(after=60, scope="s", client=client):
            assert not client.persistent
        data = os.read(reader, 65536).decode()
    finally:
        os.close(reader)
    acquire, release = data.splitlines()
    assert '"mono"' not in acquire  # torch's exact keys only
    assert torch_timer.FileTimerRequest(os.getpid(), "s", -1, 0).to_json() == release


# -- 3. the multiprocessing-queue path ----------------------------------------------------


def _torch_local_stuck(q: Any) -> None:
    torch_timer.configure(torch_timer.LocalTimerClient(q))
    with torch_timer.expires(after=0.3):
        time.sleep(WAIT * 2)


def _torch_local_released(q: Any) -> None:
    torch_timer.configure(torch_timer.LocalTimerClient(q))
    with torch_timer.expires(after=0.3):
        pass
    time.sleep(1.0)


def test_torch_local_client_against_aiotimer_queue_source(reaped: list[Event]) -> None:
    q = FORK.Queue()
    server = compat.LocalTimerServer(q, on_event=reaped.append)
    server.start()
    try:
        stuck = FORK.Process(target=_torch_local_stuck, args=(q,))
        released = FORK.Process(target=_torch_local_released, args=(q,))
        stuck.start()
        released.start()
        assert join(stuck) == -signal.SIGKILL
        assert join(released) == 0
        assert [e.pid for e in reaped if isinstance(e, WorkerReaped)] == [stuck.pid]
        assert server.get_expired_timers(math.inf) == {}
    finally:
        server.stop()
        q.close()
        q.join_thread()


def _compat_local_stuck(q: Any) -> None:
    compat.configure(compat.LocalTimerClient(q))
    with compat.expires(after=0.3):
        time.sleep(WAIT * 2)


def test_compat_local_client_against_torch_local_server() -> None:
    q = FORK.Queue()
    server = torch_timer.LocalTimerServer(q, max_interval=0.05)
    server.start()
    try:
        stuck = FORK.Process(target=_compat_local_stuck, args=(q,))
        stuck.start()
        assert join(stuck) == -signal.SIGKILL
    finally:
        server.stop()  # torch's thread may still be in q.get(): leave the queue open


# -- 4. default scopes: torch's one timer per process, aiotimer's one per block -------------


def _default_scopes(lib: Any) -> list[str]:
    """The scope ids ``lib.expires()`` gives two nested blocks and a third block."""

    class Recorder(lib.TimerClient):
        def __init__(self) -> None:
            self.scopes: list[str] = []

        def acquire(self, scope_id: str, expiration_time: float) -> None:
            self.scopes.append(scope_id)

        def release(self, scope_id: str) -> None:
            pass

    client = Recorder()
    with lib.expires(after=60, client=client), lib.expires(after=60, client=client):
        pass
    with lib.expires(after=60, client=client):
        pass
    scopes: list[str] = client.scopes
    return scopes


def test_torchs_default_scope_is_one_per_process_and_aiotimers_one_per_block() -> None:
    # torch 2.13's expires() is a @contextmanager: the caller it inspects is contextlib's
    # __enter__, so every default-scope block of a process is the same timer
    # (docs/migrating-from-torch.md, "Default scopes").
    theirs = _default_scopes(torch_timer)
    assert len(set(theirs)) == 1
    assert theirs[0].rsplit("#", 1)[0].endswith("contextlib.py")
    ours = _default_scopes(compat)
    assert len(set(ours)) == 3
    assert all(scope.startswith("test_torch_interop.py:") for scope in ours)
