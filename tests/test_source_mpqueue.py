"""QueueSource with real multiprocessing queues (and a real producer process)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import pickle
import queue
import signal
import threading
import time
import types
from collections.abc import Iterator
from typing import Any, TypeAlias, cast

import anyio
import pytest

from aiotimer.client._clients import QueueRequest
from aiotimer.errors import SourceError
from aiotimer.sources.mpqueue import QueueSource, _Bridge
from aiotimer.testing import RecordingSink, running_source, wait_until
from aiotimer.wire import Decoded, Request

pytestmark = [pytest.mark.process, pytest.mark.timeout(30)]

#: Generous bound for "promptly" on a busy 2-core machine; the real figure is ~1 ms.
PROMPT = 3.0
BRIDGE_THREAD = "aiotimer-mpqueue"

MpQueue: TypeAlias = "multiprocessing.queues.Queue[object]"


def bridge_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == BRIDGE_THREAD]


@pytest.fixture
def mpq() -> Iterator[MpQueue]:
    q: MpQueue = multiprocessing.get_context("spawn").Queue()
    yield q
    q.close()
    q.join_thread()


def torch_shaped(worker_id: object, scope_id: object, expiration_time: object) -> object:
    """A picklable stand-in for torch's TimerRequest (duck typing, no torch import)."""
    return types.SimpleNamespace(
        worker_id=worker_id, scope_id=scope_id, expiration_time=expiration_time
    )


@pytest.mark.asyncio
async def test_torch_shaped_objects_and_requests_are_converted(mpq: MpQueue) -> None:
    sink = RecordingSink()
    source = QueueSource(mpq, default_signal=signal.SIGTERM)
    assert source.name == "mpqueue"
    own = Request(pid=43, scope_id="own", expiration_time=1e10, signal=9, grace=2.0, group=True)
    async with running_source(source, sink):
        mpq.put(torch_shaped(42, "torch", 1e10))
        mpq.put(torch_shaped(42, "torch", -1))
        mpq.put(own)
        await wait_until(lambda: len(sink.requests) == 3)
    acquire, release, got_own = sink.requests
    assert acquire == Request(pid=42, scope_id="torch", expiration_time=1e10, signal=15)
    assert release.is_release and release.signal == signal.SIGTERM
    assert got_own == own
    assert {name for _, name in sink.batches} == {"mpqueue"}
    assert sink.threads == {threading.get_ident()}, "submit must run in the loop's thread"
    assert sink.rejections == []


@pytest.mark.asyncio
async def test_queue_client_requests_keep_their_signal_and_monotonic_deadline(
    mpq: MpQueue,
) -> None:
    sink = RecordingSink()
    source = QueueSource(mpq, default_signal=signal.SIGKILL)
    async with running_source(source, sink):
        mpq.put(QueueRequest(7, "q", 1e10, signal=signal.SIGTERM, mono=123.5))
        mpq.put(QueueRequest(7, "q", -1, signal=0))
        await wait_until(lambda: len(sink.requests) == 2)
    acquire, release = sink.requests
    assert acquire == Request(
        pid=7, scope_id="q", expiration_time=1e10, signal=signal.SIGTERM, mono=123.5
    )
    assert release.is_release and release.mono is None


@pytest.mark.asyncio
async def test_garbage_becomes_rejections_and_valid_items_still_apply(mpq: MpQueue) -> None:
    sink = RecordingSink()
    garbage: list[object] = [
        "hello",
        42,
        torch_shaped("42", "scope", 1e10),  # pid of the wrong type
        torch_shaped(True, "scope", 1e10),  # bool is not a pid
        torch_shaped(0, "scope", 1e10),  # pid must be > 0
        torch_shaped(42, "", 1e10),  # empty scope
        torch_shaped(42, "scope", float("nan")),
        Request(pid=-5, scope_id="neg", expiration_time=1.0, signal=9),
    ]
    async with running_source(QueueSource(mpq), sink):
        mpq.put(torch_shaped(7, "first", 1e10))
        for item in garbage:
            mpq.put(item)
        mpq.put(torch_shaped(7, "last", 1e10))
        await wait_until(lambda: len(sink.requests) + len(sink.rejections) == 10)
    assert [r.scope_id for r in sink.requests] == ["first", "last"]
    assert all(r.signal == signal.SIGKILL for r in sink.requests)
    assert len(sink.rejections) == len(garbage)
    assert sink.rejections[0].startswith("not a timer request: str")
    assert "pid" in sink.rejections[4]  # the wording is the codec's


class RaisingAttribute:
    """Torch-shaped, but reading ``worker_id`` raises (not AttributeError)."""

    scope_id = "s"
    expiration_time = 1e10

    @property
    def worker_id(self) -> int:
        raise RuntimeError("boom")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class RaisingClass:
    """Once unpickled, an object whose ``__class__`` and ``__getattr__`` raise."""

    armed = False

    def __setstate__(self, state: object) -> None:
        self.__dict__["armed"] = True

    def __getattr__(self, name: str) -> object:
        if self.__dict__.get("armed"):
            raise KeyError(name)
        raise AttributeError(name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        if self.__dict__.get("armed"):
            raise RuntimeError("no class")
        return RaisingClass


def put_raw(q: MpQueue, data: bytes) -> None:
    """Put bytes on ``q`` as if they were a pickled item (what a buggy client could do)."""
    q._sem.acquire()  # type: ignore[attr-defined]
    q._writer.send_bytes(data)  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_items_that_cannot_be_decoded_or_inspected_are_rejected_and_serving_goes_on(
    mpq: MpQueue,
) -> None:
    sink = RecordingSink()
    async with running_source(QueueSource(mpq, max_item_bytes=4096), sink):
        mpq.put(torch_shaped(7, "first", 1e10))
        put_raw(mpq, b"these bytes are not a pickle")
        put_raw(mpq, b"cno_such_module_anywhere\nThing\n.")  # a class nobody can import
        put_raw(mpq, pickle.dumps(ValueErrorOnLoad()))  # unpickling raises ValueError
        mpq.put(RaisingAttribute())
        mpq.put(RaisingClass())
        mpq.put(torch_shaped(7, "x" * 100_000, 1e10))  # too big: rejected, not unpickled
        mpq.put(torch_shaped(7, "last", 1e10))
        await wait_until(lambda: len(sink.requests) + len(sink.rejections) == 8)
    assert [r.scope_id for r in sink.requests] == ["first", "last"]
    reasons = sink.rejections
    assert reasons[0].startswith("cannot unpickle the item")
    assert "ModuleNotFoundError" in reasons[1]
    assert "ValueError" in reasons[2]
    assert "cannot inspect a RaisingAttribute: RuntimeError: boom" in reasons[3]
    assert "RaisingClass" in reasons[4]
    assert "over the 4,096 bytes" in reasons[5] and "not unpickled" in reasons[5]


class ValueErrorOnLoad:
    """Pickles fine; unpickling calls ``int("not a number")``."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (int, ("not a number",))


@pytest.mark.torch
def test_torchs_own_local_timer_client(mpq: MpQueue) -> None:
    pytest.importorskip("torch")
    from torch.distributed.elastic.timer import LocalTimerClient  # noqa: PLC0415

    sink = RecordingSink()

    async def main() -> None:
        async with running_source(QueueSource(mpq), sink):
            client = LocalTimerClient(mpq)
            client.acquire("torch-scope", 1e10)
            client.release("torch-scope")
            await wait_until(lambda: len(sink.requests) == 2)

    anyio.run(main)
    acquire, release = sink.requests
    assert (acquire.scope_id, acquire.expiration_time, acquire.is_release) == (
        "torch-scope",
        1e10,
        False,
    )
    assert release.is_release
    assert sink.rejections == []


@pytest.mark.asyncio
async def test_requests_from_a_producer_process_that_then_exits(mpq: MpQueue) -> None:
    sink = RecordingSink()
    ctx = multiprocessing.get_context("spawn")
    async with running_source(QueueSource(mpq), sink):
        req = Request(pid=77, scope_id="from-child", expiration_time=1e10, signal=9)
        producer = ctx.Process(target=mpq.put, args=(req,))
        producer.start()
        await anyio.to_thread.run_sync(producer.join, PROMPT * 3)
        assert producer.exitcode == 0
        producer.close()
        await wait_until(lambda: len(sink.requests) == 1)
        started = time.monotonic()
    # Stopping after the producer is gone is as prompt as ever.
    assert time.monotonic() - started < PROMPT
    assert sink.requests[0].scope_id == "from-child"
    assert bridge_threads() == []


@pytest.mark.asyncio
async def test_stop_with_an_empty_queue_is_prompt_and_joins_the_thread(mpq: MpQueue) -> None:
    sink = RecordingSink()
    async with anyio.create_task_group() as tg:
        await tg.start(QueueSource(mpq).serve, sink)
        assert len(bridge_threads()) == 1
        await anyio.sleep(0.05)
        started = time.monotonic()
        tg.cancel_scope.cancel()
    assert time.monotonic() - started < PROMPT
    assert bridge_threads() == []
    assert sink.batches == []


@pytest.mark.asyncio
async def test_restart_after_stop_ignores_stale_stop_tokens() -> None:
    q: queue.Queue[object] = queue.Queue()
    source = QueueSource(q)  # type: ignore[arg-type]  # a thread queue quacks the same
    sink = RecordingSink()
    for round_ in range(3):
        async with running_source(source, sink):
            q.put(torch_shaped(5, f"round{round_}", 1e10))
            await wait_until(lambda round_=round_: len(sink.requests) == round_ + 1)
        assert bridge_threads() == []
    assert [r.scope_id for r in sink.requests] == ["round0", "round1", "round2"]
    assert sink.rejections == []


@pytest.mark.asyncio
async def test_batches_are_bounded_by_max_batch() -> None:
    q: queue.Queue[object] = queue.Queue()
    for i in range(10):
        q.put(torch_shaped(5, f"s{i}", 1e10))  # all there before the bridge starts
    sink = RecordingSink()
    async with running_source(QueueSource(q, max_batch=3), sink):  # type: ignore[arg-type]
        await wait_until(lambda: len(sink.requests) == 10)
    assert [len(b.requests) for b, _ in sink.batches] == [3, 3, 3, 1]
    assert [r.scope_id for r in sink.requests] == [f"s{i}" for i in range(10)]


@pytest.mark.asyncio
async def test_a_failing_sink_stops_serve_with_its_error(mpq: MpQueue) -> None:
    sink = RecordingSink(fail_with=KeyError("boom"))
    mpq.put(torch_shaped(5, "x", 1e10))
    with anyio.fail_after(PROMPT), pytest.raises(KeyError, match="boom"):
        await QueueSource(mpq).serve(sink)
    assert bridge_threads() == []


@pytest.mark.asyncio
async def test_a_closed_queue_is_a_source_error(mpq: MpQueue) -> None:
    mpq.close()
    with anyio.fail_after(PROMPT), pytest.raises(SourceError, match="queue failed"):
        await QueueSource(mpq).serve(RecordingSink())
    assert bridge_threads() == []


def test_rejects_bad_arguments(mpq: MpQueue) -> None:
    with pytest.raises(ValueError):
        QueueSource(mpq, max_batch=0)
    assert repr(QueueSource(mpq)) == "<QueueSource max_batch=1024 default_signal=9>"


def test_batches_the_bridge_queued_are_submitted_by_a_drain_in_order() -> None:
    """What the bridge thread took off the queue but the loop has not submitted yet is
    returned by the server's drain before an expiry, oldest first, exactly once."""
    sink = RecordingSink()
    bridge = _Bridge(QueueSource(queue.Queue()), sink, cast(Any, None), cast(Any, None))
    first, second = Request(1, "a", -1, 0), Request(2, "b", -1, 0)
    bridge.pending.extend([Decoded([first], []), Decoded([second], [])])
    bridge.hold()
    assert bridge.look({7}) is True  # whoever is due: queued batches are applied
    drained = bridge.step()
    assert drained is not None and drained.requests == [first]
    assert sink.requests == []  # returned to the server, not submitted
    bridge.flush()  # what the thread's own hand-over does: the rest, once
    assert sink.requests == [second]
    bridge.hold()
    assert bridge.look({7}) is False and bridge.step() is None
