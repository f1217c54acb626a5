"""The mention scan against the decoder itself: what is left after the bytes the scan
asks to decode never holds a request for one of the pids looked for."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.wire import Request, encode
from aiotimer.wire._decoder import LineDecoder
from aiotimer.wire._mentions import MAX_SCANNED_PIDS, mentions_end, split_junk, take_due

# Pids that are prefixes, suffixes and infixes of each other's digits.
PIDS = st.sampled_from([1, 2, 12, 21, 123, 1234, 2341, 12345, 41234, 9])
SPACES = st.sampled_from(["", " ", "  ", "\t"])


@st.composite
def request_line(draw: st.DrawFn) -> bytes:
    pid = draw(PIDS)
    scope = draw(st.sampled_from(["a", "x#1234", "12", "p-9", "12.5"]))
    when = draw(st.sampled_from([-1, 0, 1.5, 1234.12345, 12.0, 1e-3, 41234.0, 1763712000.25]))
    signal = draw(st.sampled_from([9, 15, 0, -1, 12]))
    style = draw(st.integers(0, 2))
    if style == 0:
        return encode(Request(pid, scope, float(when), signal))
    sp = draw(SPACES)
    obj = {"version": 1, "pid": pid, "scope_id": scope, "expiration_time": when}
    obj["signal"] = signal
    if style == 2:
        obj = dict(reversed(list(obj.items())))
    body = json.dumps(obj).replace(": ", ":" + sp)
    return body.encode() + b"\n"


LINES = st.one_of(
    request_line(),
    st.sampled_from(
        [b"garbage 1234\n", b'{"pid": 12.0, "x": 1}\n', b"\n", b'{"pid": 12', b"not json"]
    ),
)


@settings(max_examples=400, deadline=None)
@given(
    lines=st.lists(LINES, max_size=12),
    cut=st.integers(0, 4000),
    pids=st.sets(PIDS, max_size=3),
)
def test_nothing_left_after_the_scanned_part_names_a_pid(
    lines: list[bytes], cut: int, pids: set[int]
) -> None:
    stream = b"".join(lines)
    cut = min(cut, len(stream))
    held, data = stream[:cut], stream[cut:]  # the decoder was fed ``held`` already
    probe = LineDecoder()
    probe.feed(held)
    partial = probe.pending > 0
    # The bytes alone, and seen from ``cut`` on in a buffer whose front was decoded.
    for end in (
        mentions_end(data, pids, partial=partial),
        mentions_end(stream, pids, partial=partial, start=cut),
    ):
        assert end == 0 or data[end - 1 : end] == b"\n"
        decoder = LineDecoder()
        decoder.feed(held)
        decoder.feed(data[:end])
        left = decoder.feed(data[end:])
        assert not [r for r in left.requests if r.pid in pids]


def test_digits_inside_other_numbers_are_not_mentions() -> None:
    other = encode(Request(41234, "s", 1234.12345, 9)) + encode(Request(5, "1234.5", 12345, 9))
    assert mentions_end(other, {1234}, partial=False) == 0
    mine = encode(Request(1234, "s", -1, 0))
    assert mentions_end(mine + other, {1234}, partial=False) == len(mine)
    assert mentions_end(other + mine + other, {1234}, partial=False) == len(other + mine)


def test_a_held_partial_line_is_decoded_through_its_end() -> None:
    line = encode(Request(7, "s", -1, 0))
    assert mentions_end(line[10:] + line, {1234}, partial=True) == len(line) - 10
    assert mentions_end(line[10:-1], {1234}, partial=True) == 0  # not complete yet
    # Only its newline is left: decoded all the same.
    assert mentions_end(line, {1234}, partial=True, start=len(line) - 1) == 1


def test_many_pids_count_every_complete_line() -> None:
    data = encode(Request(7, "s", -1, 0)) + b'{"pid": 8'
    pids = set(range(100, 100 + MAX_SCANNED_PIDS + 1))
    assert mentions_end(data, pids, partial=False) == data.index(b"\n") + 1


# -- taking the due workers' lines out ------------------------------------------------------


@st.composite
def mixed_line(draw: st.DrawFn) -> bytes:
    """A request line, garbage naming a pid, a request whose scope holds another pid's
    digits, or one whose scope_id key is spelt with an escape."""
    pid = draw(PIDS)
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(request_line())
    if kind == 1:
        return (
            draw(st.sampled_from([b'{"pid":%d}\n', b"junk %d\n", b'{"pid":%d,"scope_id":1}\n']))
            % pid
        )
    if kind == 2:
        return encode(Request(pid, f"at {draw(PIDS)}", -1, 0))
    return b'{"pid":%d,"scope\\u005fid":"e","expiration_time":-1,"signal":0}\n' % pid


def _by_pid(requests: list[Request]) -> dict[int, list[Request]]:
    out: dict[int, list[Request]] = {}
    for req in requests:
        out.setdefault(req.pid, []).append(req)
    return out


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(mixed_line(), max_size=20), pids=st.sets(PIDS, max_size=3) | st.none())
def test_take_due_takes_every_due_request_and_keeps_each_workers_order(
    lines: list[bytes], pids: set[int] | None
) -> None:
    data = b"".join(lines)
    whole = LineDecoder().feed(data)
    taken, left = take_due(data, pids, LineDecoder())
    rest = LineDecoder().feed(left)
    # Every line is decoded once: taken now, or left, in order, for the reader.
    assert len(taken.rejections) + len(rest.rejections) == len(whole.rejections)
    before = _by_pid(whole.requests)
    now, later = _by_pid(taken.requests), _by_pid(rest.requests)
    for pid, requests in before.items():
        if pids is None or pid in pids:
            # A due worker's requests are all taken, in order; none is left.
            assert now.get(pid) == requests and pid not in later
        else:
            # Another worker's are all left, in order.
            assert later.get(pid) == requests and pid not in now


def test_a_flood_of_garbage_naming_a_due_pid_is_left_to_the_reader() -> None:
    """``{"pid": P}`` has no scope_id: it cannot be a request, so a drain leaves it."""
    flood = b'{"pid":7}\n' * 1000
    release = encode(Request(7, "s", -1, 0))
    assert mentions_end(flood, {7}, partial=False) == 0
    taken, left = take_due(flood + release + flood, {7}, LineDecoder())
    assert [r.scope_id for r in taken.requests] == ["s"] and not taken.rejections
    assert left == flood + flood


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(mixed_line() | st.sampled_from([b"\n", b"  \n", b"x\\y\n"]), max_size=20),
    cut=st.integers(0, 4000),
    tail=st.sampled_from([b"", b'{"pid": 3', b"junk"]),
)
def test_split_junk_keeps_every_request_in_order_and_junk_is_only_rejections(
    lines: list[bytes], cut: int, tail: bytes
) -> None:
    stream = b"".join(lines) + tail
    cut = min(cut, len(stream))
    whole = LineDecoder()
    whole.feed(stream[:cut])
    partial = whole.pending > 0
    expected = whole.feed(stream[cut:])
    split = LineDecoder()
    split.feed(stream[:cut])
    candidates, junk = split_junk(stream[cut:], partial=partial)
    got = split.feed(candidates)
    assert got.requests == expected.requests
    assert split.pending == whole.pending
    for line in junk:
        one = LineDecoder().feed(line + b"\n")
        assert not one.requests and len(one.rejections) == 1
    assert len(got.rejections) + len(junk) == len(expected.rejections)
