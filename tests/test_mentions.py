"""The mention scan against the decoder itself: what is left after the bytes the scan
asks to decode never holds a request for one of the pids looked for."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.wire import Request, encode
from aiotimer.wire._decoder import LineDecoder
from aiotimer.wire._mentions import MAX_SCANNED_PIDS, mentions_end

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
