"""The multiprocessing-queue source: request objects, as torch's ``LocalTimerServer`` takes.

How it works: one bridge thread blocks in ``queue.get()`` (an idle server makes no
wake-ups), then drains up to ``max_batch`` more items with ``get_nowait()``, converts
them to requests or rejections (off the event loop), and hands the batch to the sink in
the loop's thread with one ``anyio.from_thread.run_sync`` call, which also paces the
thread to the loop. To stop, :meth:`QueueSource.serve` puts a private stop token on the
queue and waits for the thread to end; the token is unique to that run, so a stale one
never stops a later run.

Accepted items:

* objects shaped like torch's ``TimerRequest`` (attributes ``worker_id``, ``scope_id``,
  ``expiration_time``), sent with the source's ``default_signal``;
* aiotimer :class:`~aiotimer._protocol.Request` objects, as they are.

Anything else, or a field of the wrong type or value, becomes a
:class:`~aiotimer._protocol.Rejection`.
"""

from __future__ import annotations

import contextlib
import queue as queue_mod
import signal
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
import msgspec

from aiotimer._protocol import Decoded, Rejection, Request, validate
from aiotimer.errors import SourceError
from aiotimer.sources._base import RequestSink

if TYPE_CHECKING:
    import multiprocessing.queues

__all__ = ["QueueSource"]

_NAME: Final[str] = "mpqueue"


class _Queue(Protocol):
    def get(self) -> object: ...
    def get_nowait(self) -> object: ...
    def put_nowait(self, obj: object) -> None: ...


@dataclass(frozen=True, slots=True)
class _Stop:
    """The stop token of one :meth:`QueueSource.serve` run (picklable)."""

    run: str


def _describe(item: object) -> bytes:
    return repr(item)[:200].encode("utf-8", "backslashreplace")


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
            f"not a timer request: {type(item).__name__} (expected a TimerRequest with "
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
            source per queue.
        max_batch: the most items handed to the sink in one call.
        default_signal: the signal for torch-shaped requests, which carry none.

    :meth:`serve` may be called again after it returned.
    """

    __slots__ = ("_default_signal", "_max_batch", "_queue")

    def __init__(
        self,
        queue: multiprocessing.queues.Queue[object],
        *,
        max_batch: int = 1024,
        default_signal: int = signal.SIGKILL,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be positive, got {max_batch}")
        self._queue: _Queue = queue
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
                items, stop = self._next_batch()
                batch = self._decode(items)
                if batch.requests or batch.rejections:
                    anyio.from_thread.run_sync(self.sink.submit, batch, _NAME, token=self.token)
                if stop:
                    break
        except (OSError, EOFError, ValueError) as exc:
            self.error = SourceError(f"the request queue failed: {exc!r}")
        except BaseException as exc:  # e.g. the sink raised: the server must know
            self.error = exc
        finally:
            self._notify_ended()

    def _next_batch(self) -> tuple[list[object], bool]:
        """Block for one item, then take what is already there, up to ``max_batch``.

        Returns the items and whether this run's stop token came (nothing after it is
        taken, so it stays queued for the next run).
        """
        q = self.source._queue
        items: list[object] = []
        item = q.get()
        while True:
            if isinstance(item, _Stop):
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
            converted = _convert(item, default_signal)
            if isinstance(converted, Request):
                out.requests.append(converted)
            else:
                out.rejections.append(converted)
        return out

    def _notify_ended(self) -> None:
        # RuntimeError: the event loop is gone, so nobody is waiting.
        with contextlib.suppress(RuntimeError):
            anyio.from_thread.run_sync(self.ended.set, token=self.token)
