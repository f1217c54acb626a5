"""Public test helpers: deterministic fakes for aiotimer and for code that uses it.

* :class:`FakeClock` — a :class:`~aiotimer.Clock` that moves only when told to, or by
  itself to the next deadline once every task is blocked (:meth:`FakeClock.autojump`).
* :func:`settle` — wait until every other task of the loop is blocked (exactly: no
  fixed sleep), the step between "do something" and "look at what it did".
* :class:`RecordingReaper` — a reaper that records every call and kills nothing.
* :class:`RecordingClient` — a client (transport) that records the requests of the
  blocks given it, instead of sending them to a server.
* :class:`MemorySource` — a request source tests push requests or raw lines into.
* :class:`MemoryStore` — an in-memory etcd-like store for the cluster layer, with
  leases on an injected clock and a switch to simulate etcd going down.
* :class:`RecordingSink` — a request sink that records what a source delivers (for
  testing sources, yours included), with :func:`running_source` to serve a source into
  it for the duration of a block and :func:`wait_until` to await a condition, bounded.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import anyio.abc

from aiotimer.client import DEFAULT_SIGNAL
from aiotimer.cluster import MemoryStore
from aiotimer.errors import ProcessGoneError, ReapError
from aiotimer.reapers import NoDump
from aiotimer.sources import RequestSink, Source
from aiotimer.wire import Decoded, LineDecoder, Request

__all__ = [
    "FakeClock",
    "MemorySource",
    "MemoryStore",
    "ReaperCall",
    "RecordingClient",
    "RecordingReaper",
    "RecordingSink",
    "running_source",
    "settle",
    "wait_until",
]

#: Loop iterations in a row with every other task blocked that :func:`settle` waits for:
#: a task woken by a callback (``call_soon``) or by I/O readiness becomes runnable
#: within a few iterations, so one quiet iteration is not yet proof of rest.
SETTLE_TURNS = 20


def _others_blocked(this: asyncio.Task[object] | None) -> bool:
    for task in asyncio.all_tasks():
        if task is this:
            continue
        waiter = task._fut_waiter  # type: ignore[attr-defined]  # asyncio (and uvloop) tasks
        if waiter is None or waiter.done():
            return False
    return True


async def settle(*, turns: int = SETTLE_TURNS, timeout: float = 10.0) -> None:
    """Return once every other task of the running asyncio loop has been blocked (waiting
    on a future: input, an event, a fake clock) for ``turns`` loop iterations in a row.

    Unlike ``anyio.wait_all_tasks_blocked()`` on asyncio, which sleeps 0.1 s whenever a
    task is runnable, this costs only the loop iterations it waits, so a test can settle
    hundreds of times. A task that blocks on a real timer or on I/O counts as blocked.

    Raises:
        TimeoutError: the other tasks were still busy after ``timeout`` seconds.
    """
    this = asyncio.current_task()
    quiet = 0
    with anyio.fail_after(timeout):
        while quiet < turns:
            await asyncio.sleep(0)
            quiet = quiet + 1 if _others_blocked(this) else 0


class RecordingClient:
    """A :class:`~aiotimer.client.TimerClient` that records requests and sends nothing.

    ``expires(after, client=RecordingClient())`` (or ``use_client(...)``) times a block
    with no server: ``requests`` lists every acquire and release in order. Set
    ``fail_release`` to an exception to make every release raise it (and not record it).
    """

    def __init__(self, *, signal: int = DEFAULT_SIGNAL) -> None:
        self._signal = signal
        self.requests: list[Request] = []
        self.fail_release: Exception | None = None

    @property
    def signal(self) -> int:
        """The default signal of the timers acquired through this client."""
        return self._signal

    def send(self, request: Request) -> None:
        """Record ``request`` (or raise :attr:`fail_release` for a release)."""
        if request.is_release and self.fail_release is not None:
            raise self.fail_release
        self.requests.append(request)

    async def send_async(self, request: Request) -> None:
        """As :meth:`send`."""
        self.send(request)

    def acquires(self) -> list[Request]:
        """The acquires recorded, in order."""
        return [r for r in self.requests if not r.is_release]

    def __repr__(self) -> str:
        return f"<RecordingClient {len(self.requests)} requests>"


class FakeClock:
    """A manual clock for tests: ``monotonic()`` starts at ``start`` and moves by ``advance``.

    ``time()`` is ``monotonic() + wall_offset``; :meth:`step_wall` changes the offset to
    simulate a wall-clock step (NTP, a VM resume) without moving monotonic time.
    Tasks in :meth:`sleep_until` wake when an ``advance`` reaches their deadline. Use it
    from the event loop's thread only.
    """

    def __init__(self, start: float = 0.0, *, wall_offset: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._wall_offset = float(wall_offset)
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._seq = itertools.count()
        self._new_sleeper: anyio.Event | None = None

    def monotonic(self) -> float:
        """The fake monotonic time."""
        return self._now

    def time(self) -> float:
        """The fake wall-clock time: ``monotonic() + wall_offset``."""
        return self._now + self._wall_offset

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0) and wake the sleepers now due."""
        if not seconds >= 0:
            raise ValueError(f"a clock only moves forward; got advance({seconds!r})")
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            heapq.heappop(self._sleepers)[2].set()

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (may be negative); monotonic time is unchanged."""
        self._wall_offset += seconds

    def next_wakeup(self) -> float | None:
        """The earliest deadline a task is sleeping until, or ``None``."""
        return self._sleepers[0][0] if self._sleepers else None

    async def sleep_until(self, deadline: float) -> None:
        """Suspend until :meth:`advance` brings ``monotonic()`` to ``deadline``."""
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        heapq.heappush(self._sleepers, (deadline, next(self._seq), event))
        if self._new_sleeper is not None:
            self._new_sleeper.set()
        await event.wait()

    async def jump(self) -> float | None:
        """:func:`settle`, then advance to the earliest sleeper's deadline (if any) and
        settle again; returns the time jumped to, or ``None`` when nobody sleeps."""
        await settle()
        wakeup = self.next_wakeup()
        if wakeup is None:
            return None
        self.advance(max(0.0, wakeup - self._now))
        await settle()
        return wakeup

    @asynccontextmanager
    async def autojump(self) -> AsyncIterator[None]:
        """Inside the block, time jumps by itself to the next sleeper's deadline whenever
        every task is blocked (trio's ``MockClock(autojump_threshold=0)``): a test of
        timeouts runs at once, without choosing how far to advance. Tasks blocked on
        real I/O count as blocked, so only use it where the fake clock drives the test.
        """

        async def jumper() -> None:
            while True:
                await settle()
                wakeup = self.next_wakeup()
                if wakeup is None:
                    self._new_sleeper = anyio.Event()
                    await self._new_sleeper.wait()
                    self._new_sleeper = None
                else:
                    self.advance(max(0.0, wakeup - self._now))

        async with anyio.create_task_group() as tg:
            tg.start_soon(jumper, name="aiotimer-fakeclock-autojump")
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    def __repr__(self) -> str:
        return f"<FakeClock monotonic={self._now:.6f} sleepers={len(self._sleepers)}>"


@dataclass(frozen=True, slots=True)
class ReaperCall:
    """One call a :class:`RecordingReaper` received: ``method`` is the method's name."""

    method: str
    pid: int
    signum: int | None = None
    group: bool = False


class RecordingReaper:
    """A :class:`~aiotimer.reapers.Reaper` that records every call and kills nothing.

    * ``calls`` lists every :class:`ReaperCall`, in order; :meth:`signals` only the signals.
    * :meth:`exit` marks a pid exited: its ``wait_exit`` returns, later signals raise
      :class:`~aiotimer.errors.ProcessGoneError`. With ``exit_on={SIGKILL}`` (the
      default) a successful signal in that set marks the pid exited too.
    * :meth:`fail_signals` makes the next ``times`` signals to a pid raise ``error``.
    * ``nonexistent`` pids make :meth:`attach` return ``False``.
    * ``stack_dump`` is what :meth:`dump_stacks` returns.

    Use it from the event loop's thread only.
    """

    def __init__(
        self,
        *,
        nonexistent: Iterable[int] = (),
        exit_on: Iterable[int] = (signal.SIGKILL,),
        stack_dump: str | NoDump | None = None,
    ) -> None:
        self.calls: list[ReaperCall] = []
        self.nonexistent: set[int] = set(nonexistent)
        self.exit_on = frozenset(exit_on)
        self.stack_dump = stack_dump
        self._exited: set[int] = set()
        self._exit_events: dict[int, anyio.Event] = {}
        self._failures: dict[int, tuple[int, ReapError]] = {}

    # -- test controls --------------------------------------------------------------

    def exit(self, pid: int) -> None:
        """Mark ``pid`` exited and wake its ``wait_exit``."""
        self._exited.add(pid)
        event = self._exit_events.get(pid)
        if event is not None:
            event.set()

    def fail_signals(self, pid: int, times: int, error: ReapError | None = None) -> None:
        """Make the next ``times`` signals to ``pid`` raise ``error`` (a ``ReapError``)."""
        self._failures[pid] = (
            times,
            error or ReapError(f"[Errno 1] Operation not permitted: {pid}"),
        )

    def signals(self) -> list[tuple[int, int]]:
        """The ``(pid, signum)`` of every signal call that was delivered."""
        return [
            (c.pid, c.signum) for c in self.calls if c.method == "signal" and c.signum is not None
        ]

    def methods(self, pid: int) -> list[str]:
        """The names of the methods called for ``pid``, in order."""
        return [c.method for c in self.calls if c.pid == pid]

    # -- the Reaper protocol ------------------------------------------------------------

    def attach(self, pid: int, *, start_time: int | None = None) -> bool:
        """Record; ``False`` for pids in ``nonexistent``."""
        self.calls.append(ReaperCall("attach", pid))
        return pid not in self.nonexistent

    async def wait_exit(self, pid: int) -> None:
        """Record; return once :meth:`exit` marks ``pid`` exited."""
        self.calls.append(ReaperCall("wait_exit", pid))
        if pid in self._exited:
            return
        event = self._exit_events.setdefault(pid, anyio.Event())
        await event.wait()

    def signal(self, pid: int, signum: int, *, group: bool = False) -> None:
        """Record; raise as configured, else mark exited if ``signum`` is in ``exit_on``."""
        if pid in self._exited:
            self.calls.append(ReaperCall("signal_gone", pid, signum, group))
            raise ProcessGoneError(f"process {pid} has exited")
        left, error = self._failures.get(pid, (0, None))
        if left > 0 and error is not None:
            self._failures[pid] = (left - 1, error)
            self.calls.append(ReaperCall("signal_failed", pid, signum, group))
            raise error
        self.calls.append(ReaperCall("signal", pid, signum, group))
        if signum in self.exit_on:
            self.exit(pid)

    async def dump_stacks(self, pid: int, timeout: float) -> str | NoDump | None:
        """Record; return ``stack_dump``."""
        self.calls.append(ReaperCall("dump_stacks", pid))
        return self.stack_dump

    def detach(self, pid: int) -> None:
        """Record."""
        self.calls.append(ReaperCall("detach", pid))

    def __repr__(self) -> str:
        return f"<RecordingReaper {len(self.calls)} calls>"


class MemorySource:
    """An in-memory :class:`~aiotimer.sources.Source`: tests push requests or raw bytes.

    :meth:`push` delivers :class:`~aiotimer.Request` objects as one batch;
    :meth:`push_bytes` goes through a :class:`~aiotimer.wire.LineDecoder` (so bad lines become
    rejections, as from a FIFO). While the source is being served, a push reaches the
    server synchronously; before that it is queued and delivered when serving starts.
    Use it from the event loop's thread only.
    """

    def __init__(self, name: str = "memory") -> None:
        self._name = name
        self._decoder = LineDecoder()
        self._sink: RequestSink | None = None
        self._pending: list[Decoded] = []
        self.serving = False

    @property
    def name(self) -> str:
        """The name given to the server as the requests' source."""
        return self._name

    def push(self, *requests: Request) -> None:
        """Deliver ``requests`` (in order) as one batch."""
        self._deliver(Decoded(requests=list(requests)))

    def push_bytes(self, data: bytes) -> None:
        """Decode ``data`` as wire lines (partial lines are kept) and deliver the result."""
        self._deliver(self._decoder.feed(data))

    def _deliver(self, batch: Decoded) -> None:
        if self._sink is None:
            self._pending.append(batch)
        elif batch.requests or batch.rejections:
            self._sink.submit(batch, self._name)

    async def serve(
        self,
        sink: RequestSink,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Deliver queued batches, then every push, until cancelled."""
        self._sink = sink
        self.serving = True
        try:
            pending, self._pending = self._pending, []
            for batch in pending:
                self._deliver(batch)
            task_status.started()
            await anyio.sleep_forever()
        finally:
            self._sink = None
            self.serving = False

    def __repr__(self) -> str:
        return f"<MemorySource {self._name!r} serving={self.serving}>"


class RecordingSink:
    """A :class:`~aiotimer.sources.RequestSink` that records every batch a source submits.

    ``batches`` holds ``(Decoded, source_name)`` pairs in arrival order; ``threads`` the
    ids of the threads ``submit`` ran in (a source must call it from the loop's thread).
    With ``fail_with``, ``submit`` records the batch and then raises it, to test how a
    source handles a failing sink.
    """

    def __init__(self, fail_with: BaseException | None = None) -> None:
        self.batches: list[tuple[Decoded, str]] = []
        self.threads: set[int] = set()
        self.fail_with = fail_with

    def submit(self, batch: Decoded, source: str) -> None:
        """Record ``batch`` from ``source`` (then raise ``fail_with`` if set)."""
        self.threads.add(threading.get_ident())
        self.batches.append((batch, source))
        if self.fail_with is not None:
            raise self.fail_with

    @property
    def requests(self) -> list[Request]:
        """Every request received, in arrival order."""
        return [r for batch, _ in self.batches for r in batch.requests]

    @property
    def rejections(self) -> list[str]:
        """The reason of every rejection received, in arrival order."""
        return [r.reason for batch, _ in self.batches for r in batch.rejections]


@asynccontextmanager
async def running_source(source: Source, sink: RequestSink) -> AsyncIterator[None]:
    """Serve ``source`` into ``sink`` for the duration of the ``async with`` block.

    The block starts once the source reports it is ready (clients can send); leaving the
    block cancels the source, which releases its resources.
    """
    async with anyio.create_task_group() as tg:
        await tg.start(source.serve, sink)
        yield
        tg.cancel_scope.cancel()


async def wait_until(
    condition: Callable[[], bool], timeout: float = 5.0, *, interval: float = 0.002
) -> None:
    """Poll ``condition`` every ``interval`` seconds until it holds.

    Raises:
        TimeoutError: it did not hold within ``timeout`` seconds.
    """
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(interval)
