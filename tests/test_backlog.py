"""The FIFO reader's backlog, shared by the read loop and a drain's passes: whatever
order they take turns in, every line is decoded once, each worker's requests are
applied in the order they were written, and a finished pass leaves no request of its
workers behind (hypothesis, against the decoder fed the whole stream)."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.sources._backlog import PIECE, Backlog
from aiotimer.wire import Decoded, Request, encode
from aiotimer.wire._decoder import LineDecoder

PIDS = st.sampled_from([3, 7, 37, 123])


@st.composite
def line(draw: st.DrawFn) -> bytes:
    pid = draw(PIDS)
    kind = draw(st.integers(0, 4))
    if kind == 0:  # garbage naming a pid
        return b'{"pid":%d}\n' % pid
    if kind == 1:  # another worker's request whose scope holds a pid's digits
        other = draw(PIDS)
        return encode(Request(pid, f"at {other}", -1, 0))
    if kind == 2:  # the key spelt with an escape
        return b'{"pid":%d,"scope\\u005fid":"e","expiration_time":-1,"signal":0}\n' % pid
    scope = draw(st.sampled_from(["a", "b", "c"]))
    return encode(Request(pid, scope, -1.0 if kind == 3 else 5.0, 9))


def by_pid(requests: list[Request]) -> dict[int, list[tuple[str, float]]]:
    out: dict[int, list[tuple[str, float]]] = {}
    for req in requests:
        out.setdefault(req.pid, []).append((req.scope_id, req.expiration_time))
    return out


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 2000)),
        st.tuples(st.just("take"), st.integers(1, 200)),
        st.tuples(st.just("pass"), st.sets(PIDS, min_size=1, max_size=3) | st.none()),
        st.tuples(st.just("step"), st.integers(1, 300)),
        st.tuples(st.just("names"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(line(), max_size=30), first=st.sets(PIDS, min_size=1), ops=OPS)
def test_the_reader_and_the_drain_share_the_backlog(
    lines: list[bytes], first: set[int], ops: list[tuple[str, object]]
) -> None:
    stream = b"".join(lines)
    expected = LineDecoder().feed(stream)
    backlog, decoder, taken_out = Backlog(), LineDecoder(), LineDecoder()
    applied, rejected = [], 0
    fed = 0  # bytes of the stream appended
    pids: frozenset[int] | None = frozenset(first)

    def apply(batch: Decoded) -> None:
        nonlocal rejected
        applied.extend(batch.requests)
        rejected += len(batch.rejections)

    for op, arg in ops:
        if op == "append":
            assert isinstance(arg, int)
            backlog.append(stream[fed : fed + arg])
            fed = min(len(stream), fed + arg)
        elif op == "take":
            assert isinstance(arg, int)
            apply(decoder.feed(backlog.take(arg)))
        elif op == "names":
            # A pass begins: when the scan says none of its lines names the pass's
            # workers, none decodes to a request of theirs.
            backlog.rewind()
            if pids is not None:
                partial = backlog.at_front and decoder.pending > 0
                if not backlog.names(pids, partial=partial):
                    ahead = copy.deepcopy(backlog)
                    probe = copy.copy(decoder)
                    while ahead:
                        found = probe.feed(ahead.take(PIECE)).requests
                        assert not [r for r in found if r.pid in pids]
        elif op == "pass":
            pids = None if arg is None else frozenset(arg)  # type: ignore[arg-type]
            backlog.rewind()
        else:
            assert isinstance(arg, int)
            batch = backlog.pass_step(pids, decoder, taken_out, arg)
            if batch is not None:
                apply(batch)
    # The pass runs to its end: nothing it looks for is left in what was appended.
    backlog.rewind()
    while (batch := backlog.pass_step(pids, decoder, taken_out, 64)) is not None:
        apply(batch)
    held = []
    while backlog:
        held.append(backlog.take(PIECE))
    probe = copy.copy(decoder)
    left = probe.feed(b"".join(held))
    assert pids is None or not [r for r in left.requests if r.pid in pids]
    # Then the reader decodes the rest, and the stream's remainder arrives.
    apply(decoder.feed(b"".join(held)))
    apply(decoder.feed(stream[fed:]))
    assert by_pid(applied) == by_pid(expected.requests)
    assert rejected == len(expected.rejections)
