"""``expires()`` / ``expires_at()``: requests built, scope ids, exceptions, cancellation.

The unit layer: a recording client stands in for the transport.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import queue
import re
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aiotimer.client import (
    MAX_DEADLINE_AHEAD,
    Expires,
    FifoClient,
    InProcessClient,
    QueueClient,
    _block_checks,
    configure,
    expires,
    expires_at,
    use_client,
)
from aiotimer.core import _scope
from aiotimer.core._scope import default_scope, scope_at_site, scope_site, with_task
from aiotimer.errors import ClientBackpressureError, ServerUnavailableError
from aiotimer.wire import Request, number_problem, scope_id_problem


class RecordingClient:
    """A fake transport: records requests; can be told to fail acquires or releases."""

    def __init__(self, *, signal: int = 9) -> None:
        self.signal = signal
        self.requests: list[Request] = []
        self.fail_release: Exception | None = None
        self.fail_acquire: Exception | None = None

    def _record(self, request: Request) -> None:
        failure = self.fail_release if request.is_release else self.fail_acquire
        if failure is not None:
            raise failure
        self.requests.append(request)

    def send(self, request: Request) -> None:
        self._record(request)

    async def send_async(self, request: Request) -> None:
        await anyio.lowlevel.checkpoint()
        self._record(request)

    def acquired(self) -> list[str]:
        return [r.scope_id for r in self.requests if not r.is_release]


@pytest.fixture
def client() -> RecordingClient:
    return RecordingClient()


def test_sync_block_sends_acquire_then_release(client: RecordingClient) -> None:
    before_wall, before_mono = time.time(), time.monotonic()
    with expires(after=5, client=client) as block:
        assert isinstance(block, Expires)
        assert len(client.requests) == 1
    after_wall, after_mono = time.time(), time.monotonic()
    acquire, release = client.requests
    assert acquire.pid == release.pid == os.getpid()
    assert acquire.scope_id == release.scope_id == block.scope
    assert before_wall + 5 <= acquire.expiration_time <= after_wall + 5
    assert acquire.mono is not None and before_mono + 5 <= acquire.mono <= after_mono + 5
    assert acquire.signal == 9
    assert release.is_release and release.signal == 0


@pytest.mark.asyncio
async def test_async_block_sends_acquire_then_release(client: RecordingClient) -> None:
    async with expires(after=5, client=client, signal=signal.SIGTERM) as block:
        assert [r.scope_id for r in client.requests] == [block.scope]
    assert [r.is_release for r in client.requests] == [False, True]
    assert client.requests[0].signal == signal.SIGTERM


def test_expires_at_takes_a_monotonic_deadline(client: RecordingClient) -> None:
    deadline = time.monotonic() + 7
    with expires_at(deadline, client=client) as block:
        pass
    acquire = client.requests[0]
    assert acquire.mono == deadline == block.deadline
    # The epoch deadline is the same instant on the wall clock (generous tolerance).
    assert abs(acquire.expiration_time - (time.time() + 7)) < 1.0


def test_default_scope_names_the_callers_line() -> None:
    client = RecordingClient()
    with expires(after=1, client=client) as block:
        line = _lineno() - 1
    assert block.scope.startswith(f"test_expires.py:{line}#")
    assert scope_site(block.scope) == f"test_expires.py:{line}"


def _lineno() -> int:
    return sys._getframe(1).f_lineno


def test_default_scopes_are_unique_across_nested_and_repeated_blocks(
    client: RecordingClient,
) -> None:
    for _ in range(3):
        with expires(after=1, client=client), expires(after=1, client=client):
            pass
    scopes = client.acquired()
    assert len(scopes) == 6 and len(set(scopes)) == 6
    assert len({scope_site(s) for s in scopes}) == 1  # same line, different ids


@pytest.mark.asyncio
async def test_concurrent_tasks_on_one_line_never_collide(client: RecordingClient) -> None:
    live: set[str] = set()
    overlaps = 0

    async def item() -> None:
        nonlocal overlaps
        async with expires(after=5, client=client) as block:
            assert block.scope not in live
            live.add(block.scope)
            overlaps = max(overlaps, len(live))
            await anyio.sleep(0.01)
            async with expires(after=1, client=client) as inner:
                assert inner.scope != block.scope
            live.discard(block.scope)

    async with anyio.create_task_group() as tg:
        for _ in range(50):
            tg.start_soon(item)
    assert overlaps > 1
    assert len(set(client.acquired())) == 100


def test_cached_call_sites_keep_naming_their_own_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sites are cached per (code, instruction): two calls on two lines of one function
    keep their own line numbers however often they run, also when the cache starts over."""
    monkeypatch.setattr(_scope, "_MAX_SITES", 2)
    monkeypatch.setattr(_scope, "_sites", {})
    first_line = _lineno() + 3
    got: list[tuple[str, str]] = []
    for _ in range(3):
        a = default_scope(0)
        b = default_scope(0)
        got.append((scope_site(a), scope_site(b)))
    for i in range(5):  # more sites than the cache holds: it starts over, still right
        assert scope_site(exec_scope(i)) == f"<generated {i}>:{i + 1}"
    assert got == [(f"test_expires.py:{first_line}", f"test_expires.py:{first_line + 1}")] * 3
    assert len(_scope._sites) <= 2


def exec_scope(i: int) -> str:
    """A default scope taken from a freshly compiled code object, on its line ``i + 1``."""
    code = compile("\n" * i + "scope = default_scope(0)", f"<generated {i}>", "exec")
    namespace = {"default_scope": default_scope}
    exec(code, namespace)
    return str(namespace["scope"])


def test_scope_site_leaves_other_ids_alone() -> None:
    assert scope_site("a.py:12#7") == "a.py:12"
    assert scope_site("load#3") == "load#3"
    assert scope_site("train.py#42") == "train.py#42"  # torch's format: no line separator
    assert scope_site("x:1#abc") == "x:1#abc"
    assert default_scope(0).startswith("test_expires.py:")


def test_explicit_scope_is_used_as_is(client: RecordingClient) -> None:
    with expires(after=1, scope="load", client=client):
        pass
    assert [r.scope_id for r in client.requests] == ["load", "load"]


def test_a_block_is_used_once(client: RecordingClient) -> None:
    block = expires(after=1, client=client)
    with block:
        pass
    with pytest.raises(RuntimeError, match="only once"), block:
        pass
    assert "exited" in repr(block)


# -- the lifecycle: guarded transitions ------------------------------------------------


def test_a_with_block_goes_created_active_exited(client: RecordingClient) -> None:
    block = expires(after=1, scope="s", client=client)
    assert repr(block).startswith("<Expires [created]")
    with block:
        assert repr(block).startswith("<Expires [active]")
        with pytest.raises(RuntimeError, match=r"cannot enter: it is running \(.*only once"):
            block.__enter__()
    assert repr(block).startswith("<Expires [exited] scope='s' deadline=")
    assert "left" not in repr(block)  # no time left to show once it has ended
    with pytest.raises(RuntimeError, match="cannot exit: it has ended"):
        block.__exit__(None, None, None)
    assert [r.is_release for r in client.requests] == [False, True]  # nothing more sent


@pytest.mark.asyncio
async def test_leaving_a_block_never_entered_is_refused(client: RecordingClient) -> None:
    block = expires(after=1, scope="s", client=client)
    with pytest.raises(RuntimeError, match="cannot exit: it was never entered"):
        block.__exit__(None, None, None)
    with pytest.raises(RuntimeError, match="cannot exit: it was never entered"):
        await block.__aexit__(None, None, None)
    assert client.requests == []
    with block:  # the refusals changed nothing: it can still be used
        pass
    assert [r.is_release for r in client.requests] == [False, True]


def test_reschedule_sends_the_new_deadline_under_the_same_scope(client: RecordingClient) -> None:
    with expires(after=3600, scope="s", client=client, signal=15) as block:
        new = time.monotonic() + 7200
        block.reschedule(new)
        assert block.deadline == new
        assert repr(block).startswith(f"<Expires [active] scope='s' deadline={new:.3f} (")
    first, moved, release = client.requests
    assert (moved.scope_id, moved.signal, moved.mono) == ("s", 15, new)  # a sync block: one tier
    assert moved.expiration_time > first.expiration_time + 3000
    assert release.is_release


def test_reschedule_is_refused_out_of_turn_and_checks_the_deadline(
    client: RecordingClient,
) -> None:
    block = expires(after=1, scope="s", client=client)
    with pytest.raises(RuntimeError, match="cannot reschedule: it was never entered"):
        block.reschedule(time.monotonic() + 5)
    with block:
        with pytest.raises(ValueError, match="finite"):
            block.reschedule(math.nan)
        with pytest.raises(ValueError, match="epoch time"):
            block.reschedule(time.time() + 5)
    with pytest.raises(RuntimeError, match="cannot reschedule: it has ended"):
        block.reschedule(time.monotonic() + 5)
    assert [r.is_release for r in client.requests] == [False, True]


def test_a_reschedule_that_is_not_delivered_keeps_the_old_deadline() -> None:
    class Refusing(RecordingClient):
        refuse = False

        def send(self, request: Request) -> None:
            if self.refuse and not request.is_release:
                raise ServerUnavailableError("gone")
            super().send(request)

    client = Refusing()
    with expires(after=3600, scope="s", client=client) as block:
        old = block.deadline
        client.refuse = True
        with pytest.raises(ServerUnavailableError):
            block.reschedule(time.monotonic() + 5)
        assert block.deadline == old
        assert repr(block).startswith("<Expires [active]")  # still running, still timed
    assert [r.is_release for r in client.requests] == [False, True]


def test_a_template_is_never_entered_nor_decorates_twice(client: RecordingClient) -> None:
    template = expires(after=1, client=client)
    template(lambda: None)
    assert repr(template).startswith("<Expires [template]")
    with pytest.raises(RuntimeError, match="cannot enter: it decorates a function"):
        template.__enter__()
    with pytest.raises(RuntimeError, match="cannot decorate: it decorates a function"):
        template(lambda: None)
    with pytest.raises(RuntimeError, match="cannot reschedule: it decorates a function"):
        template.reschedule(time.monotonic())
    assert client.requests == []


def test_invalid_after_is_rejected() -> None:
    with pytest.raises(ValueError):
        expires(after=-1)
    with pytest.raises(ValueError):
        expires(after=float("nan"))
    with pytest.raises(TypeError):
        expires(after=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 0"):
        expires(after=-0.5, scope="s")


@pytest.mark.parametrize(
    ("kwargs", "limit"),
    [
        ({"scope": "x" * 2049}, "MAX_SCOPE_ID_LENGTH (2048)"),
        ({"scope": "x" * 4000}, "MAX_SCOPE_ID_LENGTH (2048)"),
        ({"scope": ""}, "must not be empty"),
        ({"scope": "half \ud800 a pair"}, "not valid Unicode"),
        ({"signal": 999}, "MAX_SIGNAL"),
        ({"signal": 2**31}, "MAX_SIGNAL"),
        ({"after": float("inf")}, "finite"),
    ],
)
def test_a_block_the_server_would_reject_is_refused_at_entry(
    client: RecordingClient, kwargs: dict[str, object], limit: str
) -> None:
    args: dict[str, object] = {"after": 5.0, "client": client, **kwargs}
    with pytest.raises(ValueError, match=re.escape(limit)):
        expires(**args)  # type: ignore[arg-type]
    assert client.requests == []


def test_the_longest_valid_scope_and_report_only_signals_are_accepted(
    client: RecordingClient,
) -> None:
    with expires(1, scope="x" * 2048, client=client), expires(1, client=client, signal=0):
        pass
    with expires(1, client=client, signal=-3), expires(1, client=client, signal=64):
        pass
    assert len(client.requests) == 8


def test_an_epoch_deadline_given_to_expires_at_is_refused(client: RecordingClient) -> None:
    with pytest.raises(ValueError, match=r"looks like an epoch time.*time\.monotonic\(\) \+"):
        expires_at(time.time() + 5, client=client)
    with pytest.raises(ValueError, match="finite"):
        expires_at(float("nan"), client=client)
    far = time.monotonic() + MAX_DEADLINE_AHEAD - 3600  # far, but plausibly monotonic
    with expires_at(far, client=client):
        pass
    assert client.requests[0].mono == far


def test_a_client_with_a_signal_the_server_would_reject_is_refused(tmp_path: Path) -> None:
    for make in (
        lambda: FifoClient(tmp_path / "f", signal=999),
        lambda: QueueClient(queue.Queue(), signal=65),
        lambda: InProcessClient(RecordingSubmitter(), signal=-(2**31) - 1),
    ):
        with pytest.raises(ValueError, match="MAX_SIGNAL"):
            make()


class RecordingSubmitter:
    def submit(self, request: Request) -> None:
        """Accept anything."""


def test_the_constructors_check_their_arguments() -> None:
    """expires()/expires_at() and Expires(...) check the same way."""
    with pytest.raises(TypeError, match=r"deadline must be a time\.monotonic"):
        expires_at(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exactly one"):
        Expires("s", 1.0, 2.0, None, None)
    with pytest.raises(ValueError, match=">= 0"):
        Expires("s", -1.0, None, None, None)
    block = Expires("s", 1.0, None, None, None)
    assert (block.scope, block.deadline) == ("s", None)
    assert repr(block) == "<Expires [created] scope='s' after=1s>"


def test_body_exception_is_not_masked_by_a_failing_release(
    client: RecordingClient, caplog: pytest.LogCaptureFixture
) -> None:
    client.fail_release = ServerUnavailableError("server gone")
    with (
        caplog.at_level(logging.WARNING, "aiotimer.client"),
        pytest.raises(KeyError, match="body"),
        expires(after=1, client=client),
    ):
        raise KeyError("body")
    assert "server gone" in caplog.text and "KeyError" in caplog.text


def test_a_failed_release_after_a_good_body_is_logged_not_raised(
    client: RecordingClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Finished work stays finished: the block returns normally."""
    client.fail_release = ServerUnavailableError("server gone")
    with caplog.at_level(logging.WARNING, "aiotimer.client"), expires(after=1, client=client):
        pass
    assert "server gone" in caplog.text and "after the block ended" in caplog.text


@pytest.mark.asyncio
async def test_a_failed_async_release_after_a_good_body_is_not_raised(
    client: RecordingClient,
) -> None:
    client.fail_release = ClientBackpressureError("full")
    async with expires(after=1, client=client):
        pass
    assert [r.is_release for r in client.requests] == [False]


def test_a_failed_acquire_skips_the_body(client: RecordingClient) -> None:
    client.fail_acquire = ServerUnavailableError("no server")
    ran = False
    with pytest.raises(ServerUnavailableError), expires(after=1, client=client):
        ran = True
    assert not ran and client.requests == []


@pytest.mark.asyncio
async def test_async_body_exception_is_not_masked(client: RecordingClient) -> None:
    client.fail_release = ServerUnavailableError("server gone")
    with pytest.raises(ZeroDivisionError):
        async with expires(after=1, client=client):
            _ = 1 / 0


@pytest.mark.asyncio
async def test_cancellation_propagates_untouched_and_still_releases() -> None:
    """An outer cancellation stays a cancellation (it is not the block's timeout)."""
    client = RecordingClient()
    entered = asyncio.Event()

    async def body() -> None:
        async with expires(after=5, client=client):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert [r.is_release for r in client.requests] == [False, True]


@pytest.mark.asyncio
async def test_cancellation_propagates_even_when_the_release_fails() -> None:
    client = RecordingClient()
    client.fail_release = ServerUnavailableError("gone")
    entered = asyncio.Event()

    async def body() -> None:
        async with expires(after=5, client=client):
            entered.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_the_configured_client_is_used_on_entry(client: RecordingClient) -> None:
    block = expires(after=1)  # no client yet: resolved when entered
    configure(client, dump_hook=False)
    try:
        with block:
            pass
    finally:
        configure(None)
    assert len(client.requests) == 2


def test_use_client_overrides_configure(client: RecordingClient) -> None:
    other = RecordingClient()
    configure(other, dump_hook=False)
    try:
        with use_client(client), expires(after=1):
            pass
        with expires(after=1):
            pass
    finally:
        configure(None)
    assert len(client.requests) == 2 and len(other.requests) == 2


def test_repr_shows_state_and_time_left(client: RecordingClient) -> None:
    block = expires(after=3, scope="s", client=client)
    assert repr(block) == "<Expires [created] scope='s' after=3s>"
    with block:
        assert repr(block).startswith(
            f"<Expires [active] scope='s' deadline={block.deadline:.3f} ("
        )
        assert repr(block).endswith("s left)>")
        remaining = block.remaining()
        assert remaining is not None and 0 < remaining <= 3


# -- the fast path and the entry checks' shortcuts ------------------------------------------


class NowaitClient(RecordingClient):
    """A transport with the optional fast path: records its calls; ``accept`` says
    whether it delivers (else the block falls back to send/send_async)."""

    def __init__(self, *, accept: bool) -> None:
        super().__init__()
        self.accept = accept
        self.nowait: list[tuple[str, float, int | None, float | None, bool, float, bool]] = []

    def send_nowait(  # noqa: PLR0917
        self,
        scope_id: str,
        expiration_time: float,
        signal: int | None = None,
        mono: float | None = None,
        dump: bool = False,
        kill_after: float = 0.0,
        cancelled: bool = False,
    ) -> bool:
        self.nowait.append((scope_id, expiration_time, signal, mono, dump, kill_after, cancelled))
        return self.accept


@pytest.mark.asyncio
@pytest.mark.parametrize("accept", [True, False])
async def test_blocks_try_the_clients_fast_path_with_the_requests_fields(accept: bool) -> None:
    """Any transport (not only FifoClient) gets this process's requests by their fields;
    what it does not deliver goes to send/send_async as the equivalent Request."""
    client = NowaitClient(accept=accept)
    wall = time.time()
    with expires(5, scope="sync", client=client) as block:
        pass
    async with expires(5, scope="async", client=client, signal=15, kill_after=2) as ablock:
        pass
    assert block.deadline is not None and ablock.deadline is not None
    sync, s_release, asyn, a_release = client.nowait
    (s, s_exp, s_sig, s_mono, _, s_tier, _), (a, a_exp, a_sig, a_mono, _, a_tier, _) = sync, asyn
    assert (s, s_sig, s_mono, s_tier) == ("sync", None, block.deadline, 0.0)
    # The server's tier, and the block's own deadline kill_after before it.
    assert (a, a_sig, a_mono, a_tier) == ("async", 15, ablock.deadline + 2, 2)
    assert s_release == ("sync", -1, 0, None, False, 0.0, False)
    assert a_release == ("async", -1, 0, None, False, 0.0, False)
    assert wall + 5 <= s_exp < time.time() + 5 and wall + 7 <= a_exp < time.time() + 7
    pid = os.getpid()
    expected = [
        Request(pid, "sync", s_exp, 9, None, s_mono),
        Request(pid, "sync", -1, 0),
        Request(pid, "async", a_exp, 15, None, a_mono, kill_after=2),
        Request(pid, "async", -1, 0),
    ]
    assert client.requests == ([] if accept else expected)


def test_a_fast_path_that_raises_on_acquire_fails_the_block_and_skips_the_body() -> None:
    class Broken(NowaitClient):
        def send_nowait(self, *fields: object) -> bool:
            raise ServerUnavailableError("gone")

    block = expires(5, scope="s", client=Broken(accept=True))
    with pytest.raises(ServerUnavailableError), block:
        pytest.fail("the body must not run")  # pragma: no cover
    assert repr(block).startswith("<Expires [exited]")


def test_an_explicit_scope_is_checked_once_and_a_bad_one_every_time(
    client: RecordingClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid explicit scope ids are remembered (a bounded set); refused ones never are,
    so a bad scope is refused on every block, by the shared validator's message."""
    checked: list[str] = []
    real = _block_checks.scope_id_problem

    def counting(scope_id: str) -> str | None:
        checked.append(scope_id)
        return real(scope_id)

    monkeypatch.setattr(_block_checks, "scope_id_problem", counting)
    _block_checks.valid_scopes.clear()  # a cache: the blocks' module holds the same set
    for _ in range(3):
        with expires(1, scope="fresh-scope", client=client):
            pass
        with pytest.raises(ValueError, match="MAX_SCOPE_ID_LENGTH"):
            expires(1, scope="x" * 2049, client=client)
    assert checked == ["fresh-scope"] + ["x" * 2049] * 3
    for i in range(_block_checks.MAX_VALID_SCOPES + 5):
        expires(1, scope=f"s{i}", client=client)
    assert len(_block_checks.valid_scopes) <= _block_checks.MAX_VALID_SCOPES


@given(st.one_of(st.floats(), st.integers(min_value=-(2**1100), max_value=2**1100)))
def test_the_entry_shortcut_for_numbers_agrees_with_the_validator(x: float) -> None:
    """`0 <= x <= MAX_FLOAT` accepts exactly what number_problem(minimum=0) accepts;
    everything else is refused with the validator's own message."""
    try:
        expected = number_problem("after", x, minimum=0)
    except OverflowError:  # an int too large for a float: refused either way
        expected = "overflow"
    assert (0 <= x <= _block_checks.MAX_FLOAT) == (expected is None)
    if expected is None:
        assert expires(x, scope="s").scope == "s"
        assert expires(1, scope="s", kill_after=x).scope == "s"
    elif expected != "overflow":
        with pytest.raises(ValueError, match=re.escape(expected)):
            expires(x, scope="s")
        with pytest.raises(ValueError, match=re.escape(expected.replace("after", "kill_after"))):
            expires(1, scope="s", kill_after=x)


_ANY_CHARACTER = st.characters(exclude_categories=(), exclude_characters="\x00/")


@given(
    file_name=st.text(_ANY_CHARACTER, min_size=1, max_size=3000),
    task_name=st.text(_ANY_CHARACTER, max_size=3000),
)
def test_default_scopes_are_valid_by_construction(file_name: str, task_name: str) -> None:
    """A block does not check its default scope: any file name and task name must give
    an id the validator accepts (bounded length, valid Unicode)."""
    code = compile("scope = default_scope(0)", file_name, "exec")
    namespace = {"default_scope": default_scope}
    exec(code, namespace)
    scope = str(namespace["scope"])
    assert scope_id_problem(scope) is None
    assert scope_id_problem(with_task(scope, task_name)) is None
    assert scope_id_problem(scope_at_site(scope_site(scope))) is None


class NoRoomClient(RecordingClient):
    """A client with a fast path that never delivers: every request falls back to send()."""

    def __init__(self) -> None:
        super().__init__()
        self.nowait_calls: list[tuple[object, ...]] = []

    def send_nowait(self, *args: object) -> bool:
        self.nowait_calls.append(args)
        return False


def test_sync_block_whose_fast_path_declines_sends_the_same_requests() -> None:
    # The sync face tries the fast path first; what it could not deliver goes to send()
    # as the very request the fast path was given.
    client = NoRoomClient()
    with expires(after=5, client=client, signal=signal.SIGTERM) as block:
        assert block.deadline is not None
        (fast_acquire,) = client.nowait_calls
        (acquire,) = client.requests
    scope, expiration_time, sig, mono, dump, *one_tier = fast_acquire
    assert (scope, sig, mono, dump) == (block.scope, signal.SIGTERM, block.deadline, False)
    assert one_tier in ([], [0.0])  # no second tier: kill_after left out or 0
    assert acquire == Request(os.getpid(), block.scope, expiration_time, sig, mono=mono)
    assert client.nowait_calls[1] == (block.scope, -1, 0, None, False)
    assert client.requests[1] == Request(os.getpid(), block.scope, -1, 0)


def test_sync_block_whose_fallback_acquire_fails_is_exited_and_never_released() -> None:
    client = NoRoomClient()
    client.fail_acquire = ServerUnavailableError("no server")
    block = expires(after=5, client=client)
    with pytest.raises(ServerUnavailableError), block:
        pytest.fail("the body ran without a timer")  # pragma: no cover
    assert "[exited]" in repr(block) and client.requests == []
    assert len(client.nowait_calls) == 1  # the acquire only
