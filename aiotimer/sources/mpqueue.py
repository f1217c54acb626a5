"""The multiprocessing-queue source: request objects, as torch's ``LocalTimerServer`` takes.

How it works: one bridge thread waits until the queue has an item (an idle server makes
no wake-ups), then takes up to ``max_batch`` items with ``get_nowait()``, converts them
to requests or rejections (off the event loop), queues the batch and has the loop submit
it with one ``anyio.from_thread.run_sync`` call, which also paces the thread to the
loop. Before an expiry the server's drain (:meth:`_Bridge.hold`, see
:mod:`aiotimer.sources._base`) first takes in itself, on a ``multiprocessing.Queue``,
what the queue's pipe holds (up to ``_DRAIN_ITEMS``), then returns the batches queued
when the server decided to act, so a release put before a deadline is applied before it,
however late the thread is: it waits for the loop to take each batch, so what arrives
while the loop is busy or stalled stays in the pipe. Taking from the queue and queueing
the batch are one step under a lock, the thread's or the drain's, so items keep their
order (the drain waits at most for the thread's batch in progress, ``max_batch`` items).
What the drain cannot promise: items still in the sending process (``put()`` returns
before the sender's feeder thread writes the item), and, on a thread ``queue.Queue``
(where the thread blocks in ``get()``), anything but the batches already queued. On a
``multiprocessing.Queue`` the thread waits for an item without taking it (``poll``). To
stop, :meth:`QueueSource.serve` puts a private stop token on the queue and waits for the
thread to end; the token is unique to that run, so a stale one never stops a later run.

Accepted items:

* objects shaped like torch's ``TimerRequest`` (attributes ``worker_id``, ``scope_id``,
  ``expiration_time``), sent with the source's ``default_signal``;
* aiotimer :class:`~aiotimer.wire.Request` objects, as they are.

Anything else, or a field of the wrong type or value, becomes a
:class:`~aiotimer.wire.Rejection`, and so does an item that cannot be decoded or
inspected: bytes that are not a pickle, a class the server cannot import, an attribute or
a ``repr`` that raises. Each item is judged on its own; the source keeps serving.

Trust
-----
A ``multiprocessing`` queue carries pickles, and unpickling runs code the pickle names:
whoever can put on the queue can run code in the server. The queue is reachable only by
processes it was handed to (inherited or passed at spawn), so hand it only to trusted
workers; for workers you do not trust, use the FIFO or the Unix-socket source, whose
lines are data. What this source guards against is accident, not attack: on a
``multiprocessing.Queue`` it reads each item's bytes itself and unpickles only items of at
most ``max_item_bytes`` (a 200 MiB scope is rejected unread, not unpickled), and an item
that fails to unpickle or to convert becomes a rejection instead of stopping the source.
"""

from __future__ import annotations

import contextlib
import multiprocessing.queues
import queue as queue_mod
import signal
import threading
import uuid
from collections import deque
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Final, Protocol, cast

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import msgspec

from aiotimer.errors import SourceError
from aiotimer.sources._base import RequestSink, draining
from aiotimer.wire import Decoded, Rejection, Request, validate

__all__ = ["MAX_ITEM_BYTES", "QueueSource"]

_NAME: Final[str] = "mpqueue"
#: The largest pickled item a ``multiprocessing.Queue`` source unpickles (a request
#: pickles to a few hundred bytes).
MAX_ITEM_BYTES: Final[int] = 64 * 1024


class _Queue(Protocol):
    def get(self) -> object: ...
    def get_nowait(self) -> object: ...
    def put_nowait(self, obj: object) -> None: ...


#: "No item in hand" for :meth:`_Bridge._take` (``None`` is an item: a rejected one).
_NOTHING: Final = object()
#: The items one drain takes from a ``multiprocessing.Queue``'s pipe at most: more than
#: its 64 KiB hold (a request pickles to ~150 bytes), so a flood written while it reads
#: cannot keep the loop.
_DRAIN_ITEMS: Final[int] = 1024


@dataclass(frozen=True, slots=True)
class _Stop:
    """The stop token of one :meth:`QueueSource.serve` run (picklable)."""

    run: str


class _PickledQueue:
    """A ``multiprocessing.Queue`` read as bytes: each item is unpickled here, if small.

    Mirrors ``multiprocessing.queues.Queue.get`` (same locks, same semaphore), but a
    failure to unpickle, or an item over the size bound, becomes a rejection of that
    item; the queue itself stays usable.
    """

    __slots__ = ("_max", "_q")

    def __init__(self, q: multiprocessing.queues.Queue[object], max_bytes: int) -> None:
        self._q: Any = q  # its private reader, locks and semaphore are used below
        self._max = max_bytes

    def wait(self) -> None:
        """Block until the queue has an item, taking none (no lock held meanwhile, so
        :meth:`get_nowait` is never kept waiting)."""
        q = self._q
        if q._closed:
            raise ValueError("the queue is closed")
        q._reader.poll(None)

    def get_nowait(self) -> object:
        q = self._q
        if q._closed:
            raise ValueError("the queue is closed")
        if not q._rlock.acquire(False):
            raise queue_mod.Empty
        try:
            if not q._reader.poll():
                raise queue_mod.Empty
            data = q._reader.recv_bytes()
            q._sem.release()
        finally:
            q._rlock.release()
        return self._load(data)

    def put_nowait(self, obj: object) -> None:
        self._q.put_nowait(obj)

    def _load(self, data: bytes) -> object:
        if len(data) > self._max:
            reason = (
                f"an item of {len(data):,} bytes, over the {self._max:,} bytes this source "
                "unpickles (max_item_bytes); not unpickled"
            )
            return Rejection.of(reason, data[:200])
        try:
            item: object = ForkingPickler.loads(data)
        except Exception as exc:
            return Rejection.of(f"cannot unpickle the item: {_safe_error(exc)}", data[:200])
        return item


def _queue_reader(queue: object, max_item_bytes: int) -> _Queue | _PickledQueue:
    """``queue`` itself, or a :class:`_PickledQueue` over it when it carries pickles."""
    if isinstance(queue, multiprocessing.queues.Queue) and all(
        hasattr(queue, a) for a in ("_reader", "_rlock", "_sem", "_closed")
    ):
        return _PickledQueue(queue, max_item_bytes)
    return cast(_Queue, queue)


def _safe_error(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def _describe(item: object) -> bytes:
    try:
        text = repr(item)[:200]
    except Exception as exc:
        text = f"<unprintable {_type_name(item)}: {_safe_error(exc)}>"
    return text.encode("utf-8", "backslashreplace")


def _type_name(item: object) -> str:
    try:
        return str(type(item).__qualname__)
    except Exception:
        return "object"


def _judge(item: object, default_signal: int) -> Request | Rejection:
    """:func:`_convert`, with whatever the item raises while inspected made a rejection."""
    if isinstance(item, Rejection):
        return item
    try:
        return _convert(item, default_signal)
    except Exception as exc:
        reason = f"cannot inspect a {_type_name(item)}: {_safe_error(exc)}"
        return Rejection.of(reason, _describe(item))


def _convert(item: object, default_signal: int) -> Request | Rejection:
    """``item`` as a valid :class:`Request`, or the reason it is not one."""
    fields: dict[str, object]
    if isinstance(item, Request):
        fields = msgspec.structs.asdict(item)
    elif all(hasattr(item, a) for a in ("worker_id", "scope_id", "expiration_time")):
        fields = {
            "pid": getattr(item, "worker_id"),  # noqa: B009 (duck typing)
            "scope_id": getattr(item, "scope_id"),  # noqa: B009
            "expiration_time": getattr(item, "expiration_time"),  # noqa: B009
            # torch's TimerRequest has no signal; aiotimer's QueueRequest carries one, and
            # may carry a monotonic deadline (the server prefers it, as on the FIFO).
            "signal": getattr(item, "signal", default_signal),
        }
        mono = getattr(item, "mono", None)
        if mono is not None:
            fields["mono"] = mono
    else:
        reason = (
            f"not a timer request: {_type_name(item)} (expected a TimerRequest with "
            "worker_id, scope_id, expiration_time, or an aiotimer Request)"
        )
        return Rejection.of(reason, _describe(item))
    try:
        # Unpickling and duck typing check no types; this does (strictly: no bools as ints).
        req = msgspec.convert(fields, Request)
    except msgspec.ValidationError as exc:
        return Rejection.of(f"invalid request: {exc}", _describe(item))
    problem = validate(req)
    return req if problem is None else Rejection.of(problem, _describe(item))


class QueueSource:
    """Requests from a ``multiprocessing.Queue`` (implements ``Source``).

    Args:
        queue: the queue clients put requests on (a ``queue.Queue`` works too). Use one
            source per queue. Whoever can put on it can run code in the server (see
            the module docs).
        max_batch: the most items handed to the sink in one call.
        default_signal: the signal for torch-shaped requests, which carry none.
        max_item_bytes: the largest pickled item unpickled (``multiprocessing`` queues);
            larger ones are rejected unread.

    :meth:`serve` may be called again after it returned.
    """

    __slots__ = ("_default_signal", "_max_batch", "_queue")

    def __init__(
        self,
        queue: multiprocessing.queues.Queue[object],
        *,
        max_batch: int = 1024,
        default_signal: int = signal.SIGKILL,
        max_item_bytes: int = MAX_ITEM_BYTES,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be positive, got {max_batch}")
        if max_item_bytes < 1:
            raise ValueError(f"max_item_bytes must be positive, got {max_item_bytes}")
        self._queue = _queue_reader(queue, max_item_bytes)
        self._max_batch = max_batch
        self._default_signal = int(default_signal)

    @property
    def name(self) -> str:
        """``"mpqueue"``."""
        return _NAME

    async def serve(
        self,
        sink: RequestSink,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Start the bridge thread, then feed ``sink`` until cancelled.

        Raises:
            SourceError: the queue broke (e.g. it was closed); the thread has ended.
        """
        bridge = _Bridge(self, sink, anyio.lowlevel.current_token(), anyio.Event())
        thread = threading.Thread(target=bridge.run, name=f"aiotimer-{_NAME}", daemon=True)
        thread.start()
        try:
            task_status.started()
            with draining(sink, bridge):
                await bridge.ended.wait()
        finally:
            if thread.is_alive():
                bridge.request_stop()
                with anyio.CancelScope(shield=True):
                    await bridge.ended.wait()
            thread.join()
        if bridge.error is not None:
            raise bridge.error
        raise SourceError("the queue bridge stopped unexpectedly")  # pragma: no cover

    def __repr__(self) -> str:
        return f"<QueueSource max_batch={self._max_batch} default_signal={self._default_signal}>"


class _Bridge:
    """The state one bridge thread shares with the :meth:`QueueSource.serve` that runs it."""

    def __init__(
        self,
        source: QueueSource,
        sink: RequestSink,
        token: anyio.lowlevel.EventLoopToken,
        ended: anyio.Event,
    ) -> None:
        self.source = source
        self.sink = sink
        self.token = token
        self.ended = ended
        self.stop = _Stop(uuid.uuid4().hex)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        # Batches taken off the queue, not applied yet: the loop submits them when the
        # thread asks it to (flush), or the drain returns them earlier, before an expiry.
        self.pending: deque[Decoded] = deque()
        self._popped = 0  # batches taken off ``pending`` so far (in the loop)
        self._limit = 0  # the drain's bound: ``_popped`` plus those pending at hold()
        # Held while items are taken off the queue and their batch queued (the thread's
        # or the drain's turn), so batches are queued in the order of their items.
        self._taking = threading.Lock()
        self._stopped = False  # the drain took this run's stop token

    def request_stop(self) -> None:
        """Ask the thread to end (from the loop; never blocks)."""
        self.stopping.set()
        try:
            self.source._queue.put_nowait(self.stop)
        except queue_mod.Full:
            pass  # the queue is busy: the thread sees ``stopping`` after its next batch
        except (OSError, ValueError) as exc:
            # A closed queue: get() has already failed or will; nothing else to wake.
            if self.error is None:
                self.error = SourceError(f"cannot stop the queue bridge: {exc}")

    def run(self) -> None:
        """The thread's body: forward batches until the stop token or an error."""
        try:
            while not self.stopping.is_set():
                stop = self._take_next()
                if self.pending:
                    anyio.from_thread.run_sync(self.flush, token=self.token)
                if stop:
                    break
        except (OSError, EOFError, ValueError) as exc:
            self.error = SourceError(f"the request queue failed: {exc!r}")
        except BaseException as exc:  # e.g. the sink raised: the server must know
            self.error = exc
        finally:
            self._notify_ended()

    def flush(self) -> None:
        """In the loop: submit every pending batch, oldest first."""
        while (batch := self._pop()) is not None:
            self.sink.submit(batch, _NAME)

    @property
    def name(self) -> str:
        """The source's name (the drain's batches are applied under it)."""
        return _NAME

    def hold(self) -> None:
        """In the loop, as a drain: a decision is made now; bound the drain to the
        batches queued by now, after taking in what the queue's pipe holds."""
        self.take_waiting()
        self._limit = self._popped + len(self.pending)

    def look(self, pids: AbstractSet[int] | None) -> bool:
        """In the loop, as a drain: ``True`` while batches queued before the decision
        are left (they are decoded already; applying them all is cheaper than looking
        into them)."""
        return self._popped < self._limit and bool(self.pending)

    def take_waiting(self) -> None:
        """In the loop: queue, as batches, what a ``multiprocessing.Queue``'s pipe holds
        now, up to ``_DRAIN_ITEMS`` items, after the batches the thread queued (waiting,
        if the thread is taking a batch, for it to be queued). Nothing on a thread
        ``queue.Queue``."""
        if not isinstance(self.source._queue, _PickledQueue):
            return
        with self._taking:
            for _ in range(-(-_DRAIN_ITEMS // self.source._max_batch)):
                before = len(self.pending)
                if self._take(_NOTHING):  # this run's stop token: the thread must see it
                    self._stopped = True
                    self.source._queue.put_nowait(self.stop)  # wakes its wait()
                    break
                if len(self.pending) == before:
                    break

    def step(self) -> Decoded | None:
        """In the loop, as a drain: take the oldest pending batch queued before the
        decision (``None`` if there is none); the caller applies it."""
        if self._popped >= self._limit:
            return None
        return self._pop()

    def _pop(self) -> Decoded | None:
        try:
            batch = self.pending.popleft()
        except IndexError:
            return None
        self._popped += 1
        return batch

    def _take_next(self) -> bool:
        """In the thread: wait for an item, then take what the queue holds, up to
        ``max_batch`` items, and queue it as a batch; whether this run's stop token came
        (or the drain took it)."""
        q = self.source._queue
        if isinstance(q, _PickledQueue):
            q.wait()
            with self._taking:
                return self._stopped or self._take(_NOTHING)
        first = q.get()
        with self._taking:
            return self._take(first)

    def _take(self, first: object) -> bool:
        """With ``_taking`` held: take what the queue holds after ``first`` (unless
        ``_NOTHING``), up to ``max_batch`` items, and queue them as a batch (unless empty);
        whether this run's stop token came."""
        items, stop = self._collect(first)
        batch = self._decode(items)
        if batch.requests or batch.rejections:
            self.pending.append(batch)
        return stop

    def _collect(self, first: object) -> tuple[list[object], bool]:
        """``first`` (unless ``_NOTHING``) and what is already there after it, up to
        ``max_batch`` items in all.

        Returns the items and whether this run's stop token came (nothing after it is
        taken, so it stays queued for the next run).
        """
        q = self.source._queue
        items: list[object] = []
        if first is _NOTHING:
            try:
                item = q.get_nowait()
            except queue_mod.Empty:
                return items, False
        else:
            item = first
        while True:
            if type(item) is _Stop:  # never isinstance: __class__ may be a property
                if item == self.stop:
                    return items, True
                # A stale token of an earlier run: drop it.
            else:
                items.append(item)
            if len(items) >= self.source._max_batch:
                return items, False
            try:
                item = q.get_nowait()
            except queue_mod.Empty:
                return items, False

    def _decode(self, items: Iterable[object]) -> Decoded:
        out = Decoded()
        default_signal = self.source._default_signal
        for item in items:
            converted = _judge(item, default_signal)
            if isinstance(converted, Request):
                out.requests.append(converted)
            else:
                out.rejections.append(converted)
        return out

    def _notify_ended(self) -> None:
        # RuntimeError: the event loop is gone, so nobody is waiting.
        with contextlib.suppress(RuntimeError):
            anyio.from_thread.run_sync(self.ended.set, token=self.token)
