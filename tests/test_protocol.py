"""Tests for the pure wire codec (aiotimer/wire/__init__.py).

Torch's own lines (design §4) decode and re-encode byte for byte; every malformed shape
becomes exactly one rejection without costing a neighbouring valid line; hypothesis
properties check that the decoder never raises, is indifferent to how the stream is
chunked, recovers what a writer that stopped mid-line left behind, and round-trips.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import random
import re
import struct
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aiotimer.wire import (
    MAX_LINE_BYTES,
    MAX_SCOPE_ID_LENGTH,
    MAX_SIGNAL,
    MAX_START_TIME,
    PIPE_BUF,
    Decoded,
    LineDecoder,
    Rejection,
    Request,
    RequestTooLargeError,
    block_encoder,
    check_block,
    encode,
    validate,
)
from aiotimer.wire._decoder import REJECTED_BYTES_KEPT
from aiotimer.wire._encoder import fits_block_encoder

TORCH_ACQUIRE = (
    b'{"version": 1, "pid": 4242, "scope_id": "train.py#42", '
    b'"expiration_time": 1763712000.25, "signal": 9}\n'
)
TORCH_RELEASE = (
    b'{"version": 1, "pid": 4242, "scope_id": "train.py#42", "expiration_time": -1, "signal": 0}\n'
)
VALID = b'{"pid": 7, "scope_id": "ok", "expiration_time": 12.5, "signal": 15}'
VALID_REQ = Request(pid=7, scope_id="ok", expiration_time=12.5, signal=15)

SETTINGS = settings(deadline=None, max_examples=150)


def feed_all(chunks: list[bytes], decoder: LineDecoder | None = None) -> Decoded:
    """Feed ``chunks`` in order (then flush) and merge everything decoded."""
    decoder = decoder or LineDecoder()
    total = Decoded()
    for chunk in chunks:
        got = decoder.feed(chunk)
        total.requests += got.requests
        total.rejections += got.rejections
    tail = decoder.flush()
    total.rejections += tail.rejections
    assert decoder.pending == 0
    return total


def cut(data: bytes, points: list[int]) -> list[bytes]:
    """``data`` split at ``points`` (any order, duplicates allowed)."""
    edges = [0, *sorted(p % (len(data) + 1) for p in points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def line_of(req: Request) -> bytes:
    """``encode(req)`` without its newline."""
    return encode(req)[:-1]


def as_decoded(req: Request) -> Request:
    """What a server decodes from ``encode(req)``: version 1, float expiration_time."""
    exp = -1.0 if req.is_release else float(req.expiration_time)
    return msgspec.structs.replace(req, version=1, expiration_time=exp)


# -- torch's lines ----------------------------------------------------------------------


def test_decodes_torch_lines() -> None:
    got = LineDecoder().feed(TORCH_ACQUIRE + TORCH_RELEASE)
    assert got.rejections == []
    acquire, release = got.requests
    assert acquire == Request(
        pid=4242, scope_id="train.py#42", expiration_time=1763712000.25, signal=9, version=1
    )
    assert not acquire.is_release
    assert release == Request(
        pid=4242, scope_id="train.py#42", expiration_time=-1.0, signal=0, version=1
    )
    assert release.is_release


def test_encodes_torch_lines_byte_for_byte() -> None:
    assert encode(Request(4242, "train.py#42", 1763712000.25, 9)) == TORCH_ACQUIRE
    assert encode(Request(4242, "train.py#42", -1, 0)) == TORCH_RELEASE
    # Any negative expiration_time is a release, written as torch writes it.
    assert encode(Request(4242, "train.py#42", -7.5, 0)) == TORCH_RELEASE


def test_zero_expiration_time_is_an_acquire() -> None:
    req = LineDecoder().feed(VALID.replace(b"12.5", b"0") + b"\n").requests[0]
    assert req.expiration_time == 0.0
    assert not req.is_release
    assert encode(Request(1, "s", 0, 9)).count(b'"expiration_time": 0,') == 1


def test_encodes_extension_keys_after_torch_keys() -> None:
    req = Request(5, "s", 100.5, 15, mono=3.25, grace=2.0, group=True, dump=True)
    line = encode(req)
    assert line == (
        b'{"version": 1, "pid": 5, "scope_id": "s", "expiration_time": 100.5, "signal": 15, '
        b'"mono": 3.25, "grace": 2.0, "group": true, "dump": true}\n'
    )
    assert LineDecoder().feed(line).requests == [as_decoded(req)]
    # Torch's server reads exactly these four keys with json.loads; extras are ignored.
    parsed = json.loads(line)
    assert [parsed[k] for k in ("pid", "scope_id", "expiration_time", "signal")] == [
        5,
        "s",
        100.5,
        15,
    ]


def test_the_two_tier_keys_follow_the_others_and_lines_without_them_still_decode() -> None:
    """An async block's acquire says when its own deadline is (``kill_after`` before
    the reap); the release of a block cancelled there says so. Both decode; lines
    without them (torch's) decode as before, with the defaults."""
    acquire = Request(5, "s@Task-1", 100.5, 9, mono=3.25, dump=True, kill_after=5.0)
    release = Request(5, "s@Task-1", -1, 0, cancelled=True)
    assert encode(acquire).endswith(b'"mono": 3.25, "dump": true, "kill_after": 5.0}\n')
    assert encode(release) == (
        b'{"version": 1, "pid": 5, "scope_id": "s@Task-1", "expiration_time": -1, '
        b'"signal": 0, "cancelled": true}\n'
    )
    got = LineDecoder().feed(encode(acquire) + encode(release) + VALID + b"\n").requests
    assert got[:2] == [as_decoded(acquire), as_decoded(release)]
    assert (got[2].kill_after, got[2].cancelled) == (None, False)
    assert validate(msgspec.structs.replace(acquire, kill_after=-1.0)) == (
        "kill_after must be >= 0, got -1.0"
    )
    bad = encode(acquire).replace(b"5.0}", b"-5.0}")
    assert "kill_after" in LineDecoder().feed(bad).rejections[0].reason


def test_encode_escapes_like_json_dumps() -> None:
    scope = 'naïve "quoted" \\ back\tslash ☃ 🐍 \x00'
    line = encode(Request(9, scope, 1.5, 9))
    assert line.isascii()
    assert json.loads(line)["scope_id"] == scope
    assert LineDecoder().feed(line).requests[0].scope_id == scope


def test_request_deadline_prefers_mono() -> None:
    req = Request(1, "s", 1000.0, 9)
    assert req.deadline(mono_now=50.0, wall_now=990.0) == 60.0
    assert msgspec.structs.replace(req, mono=70.0).deadline(50.0, 990.0) == 70.0


# -- torch itself, when importable ------------------------------------------------------

TORCH_CASES = [
    (4242, "train.py#42", 1763712000.25, 9),
    (4242, "train.py#42", -1, 0),  # a release, as FileTimerClient.release() builds it
    (1, "x", 0, 15),
    (31337, 'say "hi" \\ now', 1.0e9 + 0.125, -1),
    (77, "données/步骤#3 🐍", 1763712000.0, 9),
    (2**31 - 1, "a" * 1000, 12345678901.5, 6),
]


@pytest.mark.torch
@pytest.mark.parametrize(("pid", "scope", "exp", "sig"), TORCH_CASES)
def test_encode_matches_torch_to_json(pid: int, scope: str, exp: float, sig: int) -> None:
    timer = pytest.importorskip("torch.distributed.elastic.timer.file_based_local_timer")
    theirs = timer.FileTimerRequest(pid, scope, exp, sig).to_json() + "\n"
    assert encode(Request(pid, scope, exp, sig)) == theirs.encode("ascii")


@pytest.mark.torch
def test_torch_server_parses_our_lines(tmp_path: Path) -> None:
    """Torch's FileTimerServer request reader accepts our lines, extensions included."""
    timer = pytest.importorskip("torch.distributed.elastic.timer.file_based_local_timer")
    ours = [
        Request(10, "plain", 1763712000.5, 9),
        Request(11, 'q"uote ☃', 1763712001.0, 15, mono=42.0, grace=1.5, group=True, dump=True),
        Request(12, "async@Task-1", 1763712002.0, 9, mono=43.0, kill_after=5.0),
        Request(12, "async@Task-1", -1, 0, cancelled=True),
        Request(10, "plain", -1, 0),
    ]
    text = b"".join(encode(r) for r in ours).decode("ascii")
    server = timer.FileTimerServer(str(tmp_path / "fifo"), run_id="test")
    server._run_once = True  # torch's own test hook: read to EOF, then return
    parsed = server._get_requests(io.StringIO(text), max_interval=60)
    assert [(p.worker_pid, p.scope_id, p.expiration_time, p.signal) for p in parsed] == [
        (r.pid, r.scope_id, -1 if r.is_release else r.expiration_time, r.signal) for r in ours
    ]


# -- malformed input ---------------------------------------------------------------------


def obj(**overrides: object) -> bytes:
    """A torch-shaped line with keys overridden (``None`` value: key removed)."""
    base: dict[str, object] = {
        "version": 1,
        "pid": 7,
        "scope_id": "ok",
        "expiration_time": 12.5,
        "signal": 15,
    }
    base.update(overrides)
    return json.dumps({k: v for k, v in base.items() if v is not None}).encode()


MALFORMED = {
    "garbage": (b"hello world", "malformed JSON"),
    "lone brace": (b"{", "malformed JSON"),
    "truncated": (VALID[:30], "malformed JSON"),
    "array": (b"[1, 2]", "Expected `object`"),
    "null": (b"null", "Expected `object`"),
    "empty object": (b"{}", "missing required field"),
    "bool pid": (obj(pid=True), "Expected `int`, got `bool`"),
    "float pid": (obj(pid=7.0), "Expected `int`, got `float`"),
    "string pid": (obj(pid="7"), "Expected `int`, got `str`"),
    "huge pid": (obj(pid=10**30), "Expected `int` <= 2147483647 - at `$.pid`"),
    "pid over pid_t": (obj(pid=2**31), "Expected `int` <= 2147483647 - at `$.pid`"),
    "zero pid": (obj(pid=0), "Expected `int` >= 1 - at `$.pid`"),
    "negative pid": (obj(pid=-5), "Expected `int` >= 1 - at `$.pid`"),
    "huge signal": (obj(signal=2**31), f"Expected `int` <= {MAX_SIGNAL} - at `$.signal`"),
    "no such signal": (obj(signal=999), f"Expected `int` <= {MAX_SIGNAL} - at `$.signal`"),
    "huge negative signal": (obj(signal=-(2**31) - 1), "Expected `int` >= -2147483648"),
    "string expiration_time": (obj(expiration_time="soon"), "Expected `float`, got `str`"),
    "null expiration_time": (
        b'{"pid": 7, "scope_id": "x", "expiration_time": null, "signal": 9}',
        "got `null`",
    ),
    "NaN": (VALID.replace(b"12.5", b"NaN"), "malformed JSON"),
    "Infinity": (VALID.replace(b"12.5", b"Infinity"), "malformed JSON"),
    "-Infinity": (VALID.replace(b"12.5", b"-Infinity"), "malformed JSON"),
    "1e400": (VALID.replace(b"12.5", b"1e400"), "out of range"),
    "-1e400": (VALID.replace(b"12.5", b"-1e400"), "out of range"),
    "float signal": (obj(signal=9.5), "Expected `int`, got `float`"),
    "unknown version": (obj(version=2), "unsupported protocol version (only 1 is known)"),
    "version 0": (obj(version=0), "unsupported protocol version"),
    "string version": (obj(version="1"), "Expected `int | null`, got `str`"),
    "missing pid": (obj(pid=None), "missing required field `pid`"),
    "missing scope_id": (obj(scope_id=None), "missing required field `scope_id`"),
    "missing expiration_time": (obj(expiration_time=None), "`expiration_time`"),
    "missing signal": (obj(signal=None), "missing required field `signal`"),
    "empty scope_id": (obj(scope_id=""), "Expected `str` of length >= 1 - at `$.scope_id`"),
    "int scope_id": (obj(scope_id=5), "Expected `str`, got `int`"),
    "long scope_id": (obj(scope_id="s" * (MAX_SCOPE_ID_LENGTH + 1)), "length <= 2048"),
    "infinite mono": (VALID[:-1] + b', "mono": 1e999}', "out of range"),
    "negative grace": (VALID[:-1] + b', "grace": -1}', "Expected `float` >= 0.0"),
    "invalid UTF-8": (VALID.replace(b"ok", b"o\xffk"), "invalid UTF-8"),
    "lone surrogate": (VALID.replace(b"ok", b"\\ud800"), "malformed JSON"),
    "deep nesting": (VALID[:-1] + b', "x": ' + b"[" * 1500 + b"]" * 1500 + b"}", "nested"),
    "two objects": (VALID + b" " + b"{}", "malformed JSON"),
}


@pytest.mark.parametrize(("line", "reason"), MALFORMED.values(), ids=list(MALFORMED))
def test_malformed_line_is_one_rejection_between_valid_lines(line: bytes, reason: str) -> None:
    assert b"\n" not in line
    assert len(line) < MAX_LINE_BYTES
    data = VALID + b"\n" + line + b"\n" + VALID + b"\n"
    for chunks in ([data], [data[:5], data[5:]], [bytes([b]) for b in data]):
        got = feed_all(chunks)
        assert got.requests == [VALID_REQ, VALID_REQ]
        assert len(got.rejections) == 1
        assert reason in got.rejections[0].reason
        assert got.rejections[0].line == line[:REJECTED_BYTES_KEPT]


def test_valid_shapes_that_are_accepted() -> None:
    cases = {
        "no version": b'{"pid": 7, "scope_id": "ok", "expiration_time": 12.5, "signal": 15}',
        "unknown keys": obj(future={"nested": [1, {"a": None}]}, extra="x"),
        "int expiration_time": obj(expiration_time=12),
        "braces in scope": obj(scope_id="{not} a }{ brace"),
        "signal <= 0": obj(signal=-3),
        "leading spaces": b"   " + VALID,
        "CRLF": VALID + b"\r",
        "max scope_id": obj(scope_id="s" * MAX_SCOPE_ID_LENGTH),
    }
    for name, line in cases.items():
        got = LineDecoder().feed(line + b"\n")
        assert got.rejections == [], name
        assert len(got.requests) == 1, name
        req = got.requests[0]
        assert isinstance(req.expiration_time, float), name
        assert validate(req) is None, name


def test_blank_lines_are_ignored() -> None:
    got = feed_all([b"\n\n  \n\r\n" + VALID + b"\n\n\t\n"])
    assert got.requests == [VALID_REQ]
    assert got.rejections == []


def test_crlf_lines_decode() -> None:
    got = feed_all([(VALID + b"\r\n") * 3])
    assert got == Decoded([VALID_REQ] * 3, [])


def test_lines_split_across_feeds() -> None:
    d = LineDecoder()
    assert d.feed(VALID[:10]) == Decoded()
    assert d.pending == 10
    assert d.feed(VALID[10:]) == Decoded()
    assert d.feed(b"\n" + VALID[:3]).requests == [VALID_REQ]
    assert d.pending == 3
    assert d.feed(VALID[3:] + b"\n").requests == [VALID_REQ]
    assert d.pending == 0


def test_incomplete_line_at_end_of_stream() -> None:
    d = LineDecoder()
    d.feed(VALID + b"\n" + VALID[:20])
    tail = d.flush()
    assert tail.requests == []
    assert [r.reason for r in tail.rejections] == ["incomplete line at end of stream"]
    assert tail.rejections[0].line == VALID[:20]
    assert d.pending == 0
    assert d.flush() == Decoded()


def test_misaligned_objects_are_not_accepted_as_lines() -> None:
    """Lines that only add up to n objects when joined are each rejected (regression).

    "{a}, {b}" on one line plus one object split over two lines used to pass the
    one-array fast path as three valid requests.
    """
    a = b'{"pid": 1, "scope_id": "a", "expiration_time": 1, "signal": 9}'
    b = b'{"pid": 2, "scope_id": "b", "expiration_time": 1, "signal": 9}'
    head, tail = b'{"pid": 3, "scope_id": "c"', b'"expiration_time": 1, "signal": 9}'
    got = LineDecoder().feed(head + b"\n" + tail + b"\n" + a + b", " + b + b"\n")
    # Three bad lines; the mid-line resync salvages only the trailing `b` of the third.
    assert [r.pid for r in got.requests] == [2]
    assert len(got.rejections) == 3
    # Alone, an object split over two lines (every "}" at a line's end) ...
    got = LineDecoder().feed(head + b",\n" + tail + b"\n")
    assert (got.requests, len(got.rejections)) == ([], 2)
    # ... and "{a}, {b}" after two lines that one string spans (the "}" ending the first
    # is inside it) add up to as many objects as lines.
    first, second = b'{"pid": 4, "scope_id": "}', b'", "expiration_time": 1, "signal": 9}'
    got = LineDecoder().feed(first + b"\n" + second + b"\n" + a + b", " + b + b"\n")
    assert [r.pid for r in got.requests] == [2]
    assert len(got.rejections) == 3


def test_two_invalid_lines_never_merge_into_one_request() -> None:
    """Braces inside strings can join two bad lines into one valid object (regression).

    Joined into one array, `{"...": "}` and `{", ...}` read as a single request whose
    scope_id is "},{": the fast path must notice it got fewer objects than lines.
    """
    first = b'{"pid": 7, "scope_id": "}'
    second = b'{", "expiration_time": 1, "signal": 9}'
    for block in (first + b"\n" + second + b"\n", VALID + b"\n" + first + b"\n" + second + b"\n"):
        got = LineDecoder().feed(block)
        assert [r.scope_id for r in got.requests] == (["ok"] if block.startswith(VALID) else [])
        assert len(got.rejections) == 2


def test_rejection_keeps_a_bounded_copy() -> None:
    long_garbage = b"z" * 3000
    got = LineDecoder().feed(long_garbage + b"\n")
    assert got.rejections == [Rejection.of(got.rejections[0].reason, long_garbage)]
    assert len(got.rejections[0].line) == REJECTED_BYTES_KEPT


# -- size limits ----------------------------------------------------------------------------


def padded(total: int) -> bytes:
    """A valid line (unknown ``pad`` key) of exactly ``total`` bytes, newline included."""
    base = VALID[:-1] + b', "pad": ""}\n'
    return base[:-3] + b"x" * (total - len(base)) + base[-3:]


def test_line_of_exactly_max_bytes_is_accepted() -> None:
    line = padded(MAX_LINE_BYTES)
    assert len(line) == MAX_LINE_BYTES
    for chunks in ([line], [line[:100], line[100:]], [line[:-1], line[-1:]]):
        assert feed_all(chunks) == Decoded([VALID_REQ], [])


def test_line_one_byte_over_is_rejected_once() -> None:
    line = padded(MAX_LINE_BYTES + 1)
    for chunks in ([line + VALID + b"\n"], [line[:2000], line[2000:] + VALID + b"\n"]):
        got = feed_all(chunks)
        assert got.requests == [VALID_REQ]
        assert [r.reason for r in got.rejections] == [f"line longer than {MAX_LINE_BYTES} bytes"]


def test_megabytes_without_newline_are_not_buffered() -> None:
    d = LineDecoder()
    mib = b"x" * (1 << 20)
    for _ in range(4):
        assert d.feed(mib) == Decoded()
        assert d.pending <= MAX_LINE_BYTES - 1
    for byte in b"yyy":
        d.feed(bytes([byte]))
        assert d.pending <= MAX_LINE_BYTES - 1
    got = d.feed(b"\n" + VALID + b"\n")
    assert got.requests == [VALID_REQ]
    assert len(got.rejections) == 1
    assert got.rejections[0].reason == f"line longer than {MAX_LINE_BYTES} bytes"
    assert d.pending == 0


def test_valid_line_glued_to_an_oversized_one_is_recovered() -> None:
    got = feed_all([b"x" * 10_000, VALID + b"\n"])
    assert got.requests == [VALID_REQ]
    assert len(got.rejections) == 1
    got = feed_all([b"x" * 10_000 + VALID + b"\n"])  # same, within one chunk
    assert got.requests == [VALID_REQ]
    assert len(got.rejections) == 1


def test_custom_max_line() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        LineDecoder(max_line=1)
    d = LineDecoder(max_line=len(VALID) + 1)
    assert d.feed(VALID + b"\n").requests == [VALID_REQ]
    got = d.feed(b" " + VALID + b"\n")
    assert got.rejections[0].reason == f"line longer than {len(VALID) + 1} bytes"


def scope_for_line_size(total: int) -> str:
    """A valid scope_id whose encoded request is ``total`` bytes, newline included."""
    base = len(encode(Request(1, "", 5.0, 9)))
    escaped, plain = divmod(total - base, 6)  # "é" is written as the 6 bytes \u00e9
    scope = "é" * escaped + "x" * plain
    assert 0 < len(scope) <= MAX_SCOPE_ID_LENGTH
    return scope


def test_encode_size_limit_counts_the_newline() -> None:
    fits = Request(1, scope_for_line_size(PIPE_BUF), 5.0, 9)
    line = encode(fits)
    assert len(line) == PIPE_BUF
    assert LineDecoder().feed(line).requests == [as_decoded(fits)]
    too_big = Request(1, scope_for_line_size(PIPE_BUF + 1), 5.0, 9)
    with pytest.raises(RequestTooLargeError, match=f"{PIPE_BUF + 1} bytes"):
        encode(too_big)
    assert issubclass(RequestTooLargeError, ValueError)


@pytest.mark.parametrize(
    "req",
    [
        Request(1, "s", math.nan, 9),
        Request(1, "s", math.inf, 9),
        Request(1, "s", 5.0, 9, mono=math.inf),
        Request(1, "s", 5.0, 9, grace=math.nan),
    ],
)
def test_encode_refuses_non_finite_numbers(req: Request) -> None:
    with pytest.raises(ValueError, match="finite"):
        encode(req)


# -- properties ---------------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False)
requests = st.builds(
    Request,
    pid=st.integers(1, 2**31 - 1),
    scope_id=st.text(min_size=1, max_size=40),
    expiration_time=st.one_of(st.just(-1.0), st.floats(0, 1e15), st.integers(0, 2**40)),
    signal=st.one_of(st.integers(-64, MAX_SIGNAL), st.sampled_from([-(2**31)])),
    mono=st.none() | finite,
    grace=st.none() | st.floats(0, 1e6),
    group=st.booleans(),
    dump=st.booleans(),
    start_time=st.none() | st.integers(0, MAX_START_TIME),
    kill_after=st.none() | st.floats(0, 1e6),
    cancelled=st.booleans(),
)
valid_lines = requests.map(line_of)

_bad_values: list[tuple[str, object]] = [
    ("pid", True),
    ("pid", 1.5),
    ("pid", 0),
    ("pid", -9),
    ("pid", "1"),
    ("scope_id", ""),
    ("scope_id", 3),
    ("expiration_time", "x"),
    ("expiration_time", None),
    ("signal", 1.5),
    ("version", 3),
]
# Lines that hold no valid request and no '{"' after their start (which the mid-line
# resync would try to salvage): exactly one rejection each.
garbage_lines = st.one_of(
    st.binary(min_size=1, max_size=80).filter(
        lambda b: b"\n" not in b and b'{"' not in b and bool(b.strip())
    ),
    st.tuples(valid_lines, st.integers(1, 10_000)).map(
        lambda t: t[0][: max(1, t[1] % (len(t[0]) - 1))]  # a strict prefix of a line
    ),
    st.sampled_from(_bad_values).map(lambda kv: obj(**{kv[0]: kv[1]})),
    st.integers(MAX_LINE_BYTES, 3 * MAX_LINE_BYTES).map(lambda n: b"q" * n),
)
blank_lines = st.sampled_from([b"", b" ", b"\t", b"\r", b" \r"])
chunk_points = st.lists(st.integers(0, 1 << 20), max_size=12)


@SETTINGS
@given(
    pieces=st.lists(
        st.one_of(
            st.binary(max_size=64),
            st.sampled_from([b"\n", b'{"', b"}", b"[", b"\xff", b'"\\ud800"', b"\r\n"]),
            valid_lines,
        ),
        max_size=30,
    ),
    points=chunk_points,
    max_line=st.one_of(st.just(MAX_LINE_BYTES), st.integers(2, 300)),
)
def test_random_bytes_never_raise_and_chunking_does_not_matter(
    pieces: list[bytes], points: list[int], max_line: int
) -> None:
    data = b"".join(pieces)
    d = LineDecoder(max_line)
    total = Decoded()
    for chunk in cut(data, points):
        got = d.feed(chunk)
        assert d.pending <= max_line - 1
        assert all(validate(r) is None for r in got.requests)
        total.requests += got.requests
        total.rejections += got.rejections
    total.rejections += d.flush().rejections
    assert d.pending == 0
    # How the stream was cut into chunks changes nothing.
    assert total == feed_all([data], LineDecoder(max_line))


@SETTINGS
@given(
    lines=st.lists(
        st.one_of(
            requests.map(lambda r: (r, line_of(r))),
            garbage_lines.map(lambda b: (None, b)),
            blank_lines.map(lambda b: (None, b)),
        ),
        max_size=25,
    ),
    points=chunk_points,
)
def test_valid_lines_survive_garbage_in_any_chunking(
    lines: list[tuple[Request | None, bytes]], points: list[int]
) -> None:
    data = b"".join(line + b"\n" for _, line in lines)
    got = feed_all(cut(data, points))
    assert got.requests == [as_decoded(req) for req, _ in lines if req is not None]
    garbage = [line for req, line in lines if req is None and line.strip()]
    assert len(got.rejections) == len(garbage)


@SETTINGS
@given(
    stopped=valid_lines,
    stop_at=st.integers(0, 10_000),
    reqs=st.lists(requests, min_size=1, max_size=8),
    points=chunk_points,
)
def test_writer_stopped_mid_line_costs_only_its_own_line(
    stopped: bytes, stop_at: int, reqs: list[Request], points: list[int]
) -> None:
    prefix = stopped[: stop_at % (len(stopped) + 1)]  # up to the whole line, no newline
    data = prefix + b"".join(encode(r) for r in reqs)
    got = feed_all(cut(data, points))
    assert got.requests == [as_decoded(r) for r in reqs]
    assert len(got.rejections) == (1 if prefix else 0)


def one_line_at_a_time(lines: list[bytes], max_line: int = MAX_LINE_BYTES) -> Decoded:
    """What each line decodes to on its own, in a fresh decoder, merged in order, by the
    exact line-by-line path (a blank line after it keeps the block off the fast path)."""
    total = Decoded()
    for line in lines:
        got = LineDecoder(max_line).feed(line + b"\n\n")
        total.requests += got.requests
        total.rejections += got.rejections
    return total


# Fragments rich in the bytes the fast path counts and joins on: braces inside and
# outside strings, quotes, commas, whole and partial valid lines.
line_fragments = st.one_of(
    st.sampled_from(
        [b"{", b"}", b'"', b'{"', b'"}', b",", b'", ', b"\\", b" ", b"[", b"]", b":", b"\r"]
    ),
    st.sampled_from([b'"pid": 7', b'"scope_id": "', b'"expiration_time": 1', b'"signal": 9']),
    # what the fast path puts after each newline, and other whole JSON values
    st.sampled_from([b"null", b"null null", b" null", b"0", b"[]", b"{}", b'"x"', b"[null"]),
    st.binary(max_size=8).filter(lambda b: b"\n" not in b),
    st.builds(lambda line, k: line[: k % (len(line) + 1)], st.just(VALID), st.integers(0, 99)),
    st.builds(lambda line, k: line[k % (len(line) + 1) :], st.just(VALID), st.integers(0, 99)),
)
fragment_lines = st.one_of(
    st.lists(line_fragments, max_size=8).map(b"".join),
    requests.map(line_of),
)


def split_after_braces(line: bytes, cuts: list[bool]) -> list[bytes]:
    """``line`` cut after some of its '}' bytes (``cuts`` picks which, cyclically)."""
    pieces, start = [], 0
    braces = [i + 1 for i, byte in enumerate(line[:-1]) if byte == ord("}")]
    for k, end in enumerate(braces):
        if cuts and cuts[k % len(cuts)]:
            pieces.append(line[start:end])
            start = end
    return [*pieces, line[start:]]


# A valid line whose scope_id holds braces, cut after some of them: each piece ends with
# '}' and, joined back with ',' in one array, may read as fewer valid objects.
braced_scopes = st.lists(st.sampled_from(["}{", "}", "{", "a", '"', ", "]), min_size=1).map("".join)
split_lines = st.builds(
    split_after_braces,
    st.builds(Request, st.integers(1, 99), braced_scopes, st.floats(0, 1e9), st.just(9)).map(
        line_of
    ),
    st.lists(st.booleans(), min_size=1, max_size=5),
)


# A valid line cut anywhere into two lines (an object split over lines: its first part
# need not end with '}'), and two valid objects on one line (a line ending with '}' that
# holds another '}').
cut_lines = st.builds(
    lambda line, k: [line[: k % (len(line) + 1)], line[k % (len(line) + 1) :]],
    requests.map(line_of),
    st.integers(0, 999),
)
two_on_a_line = st.builds(
    lambda a, sep, b: [a + sep + b],
    requests.map(line_of),
    st.sampled_from([b",", b", ", b" "]),
    requests.map(line_of),
)


# A valid line that the fast path may take, but whose bytes hold what its proof is about:
# extension keys nesting objects and arrays (with nulls), braces, brackets and "null" in
# the scope id, a CRLF ending.
unusual_lines = st.builds(
    lambda req, extra, crlf: line_of(req)[:-1] + extra + (b"\r" if crlf else b""),
    st.builds(
        Request,
        st.integers(1, 99),
        st.lists(st.sampled_from(["}", "{", "[", "]", "null", ", ", "a"]), min_size=1).map("".join),
        st.floats(0, 1e9),
        st.just(9),
    ),
    st.sampled_from([b"}", b', "x": {"y": [null, {}]}}', b', "x": null}', b', "x": [[]]}']),
    st.booleans(),
)

# A valid line with the value of an extension key cut out, and a newline in its place:
# what a value put after the newline would complete (a line holding more values after it).
holed_lines = st.builds(
    lambda req, tail: [line_of(req)[:-1] + b', "x":', b"}" + tail],
    requests,
    st.sampled_from([b"", b" null", b" null null", b" null " + VALID, b" null null " + VALID]),
)


@settings(deadline=None, max_examples=300)
@given(
    groups=st.lists(
        fragment_lines.map(lambda line: [line])
        | unusual_lines.map(lambda line: [line])
        | holed_lines
        | split_lines
        | cut_lines
        | two_on_a_line,
        min_size=1,
        max_size=6,
    ),
    points=chunk_points,
    max_line=st.one_of(st.just(MAX_LINE_BYTES), st.integers(2, 200)),
)
def test_each_line_has_the_outcome_it_has_alone(
    groups: list[list[bytes]], points: list[int], max_line: int
) -> None:
    """Exactly one line's worth of outcome per line: whatever shares its chunk, a line
    decodes as it does on its own (never merged with a neighbour, never lost), and one
    over ``max_line`` is rejected as it is on its own."""
    lines = [line for group in groups for line in group]
    data = b"".join(line + b"\n" for line in lines)
    assert feed_all(cut(data, points), LineDecoder(max_line)) == one_line_at_a_time(lines, max_line)


@settings(deadline=None, max_examples=100)
@given(st.lists(unusual_lines, min_size=1, max_size=8))
def test_blocks_of_unusual_valid_lines_take_the_fast_path(lines: list[bytes]) -> None:
    """CRLF, braces in scope ids and nested extension keys do not cost the one-call path."""
    want = one_line_at_a_time(lines)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("aiotimer.wire._decoder._decode_line", None)  # the line-by-line path fails
        assert LineDecoder().feed(b"".join(line + b"\n" for line in lines)) == want


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=20),
    max_line=st.integers(2, 50),
)
def test_the_line_length_check_is_exact(lengths: list[int], max_line: int) -> None:
    block = b"".join(b"x" * n + b"\n" for n in lengths)
    fits = max(lengths) + 1 <= max_line
    assert LineDecoder(max_line)._lines_fit(block) is fits


int_edges = st.sampled_from(
    [-(2**31) - 1, -(2**31), -1, 0, 1, MAX_SIGNAL, MAX_SIGNAL + 1, 999, 2**31 - 1, 2**31, 2**63]
)
float_edges = st.sampled_from([-1.0, -0.0, 0.0, 1e-300, 1e300, math.inf, -math.inf, math.nan])


@SETTINGS
@given(
    pid=int_edges,
    scope_id=st.sampled_from(
        ["", "a", "é" * MAX_SCOPE_ID_LENGTH, "x" * (MAX_SCOPE_ID_LENGTH + 1), "a\ud800", "\udfff"]
    ),
    expiration_time=float_edges,
    signal=int_edges,
    version=st.none() | int_edges,
    mono=st.none() | float_edges,
    grace=st.none() | float_edges,
)
def test_validate_agrees_with_decoding(
    *,
    pid: int,
    scope_id: str,
    expiration_time: float,
    signal: int,
    version: int | None,
    mono: float | None,
    grace: float | None,
) -> None:
    """validate() (for Requests built in Python) states exactly the codec's rules."""
    req = Request(pid, scope_id, expiration_time, signal, version, mono, grace)
    fields = {
        "pid": pid,
        "scope_id": scope_id,
        "expiration_time": expiration_time,
        "signal": signal,
        "version": version,
        "mono": mono,
        "grace": grace,
    }
    # allow_nan=True writes NaN/Infinity, which are not JSON: the codec must refuse them.
    line = json.dumps({k: v for k, v in fields.items() if v is not None}).encode()
    got = LineDecoder(max_line=1 << 16).feed(line + b"\n")  # rules, not line size
    assert len(got.requests) + len(got.rejections) == 1
    assert (validate(req) is None) == bool(got.requests)
    if got.requests:
        assert got.requests == [req]


@SETTINGS
@given(req=requests)
def test_round_trip(req: Request) -> None:
    line = encode(req)
    assert line.isascii()
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert LineDecoder().feed(line) == Decoded([as_decoded(req)], [])
    if not (req.mono is not None or req.grace is not None or req.group or req.dump) and (
        req.start_time is None and req.kill_after is None and not req.cancelled
    ):
        exp = -1 if req.is_release else req.expiration_time
        torch_dict = {
            "version": 1,
            "pid": req.pid,
            "scope_id": req.scope_id,
            "expiration_time": exp,
            "signal": req.signal,
        }
        assert line == (json.dumps(torch_dict) + "\n").encode()


# -- block_encoder: the client's hot path ---------------------------------------------------

# Floats drawn over their whole bit range, so every exponent (and the edges of the range
# where block_encoder formats with msgspec instead of repr) is exercised, not only the
# "nice" values a float strategy favours.
any_float_bits = st.integers(0, 2**63 - 1).map(
    lambda bits: struct.unpack("<d", struct.pack("<q", bits))[0]
)
fast_range = st.floats(1e-4, 1e16, exclude_max=True)
block_numbers = st.one_of(
    fast_range,
    any_float_bits,
    st.sampled_from([0.0, -0.0, 1e-5, 1e-4, 1e16, 9999999999999998.0, -1.5, math.inf, math.nan]),
    st.integers(0, 2**53),
)


def reference_block(
    pid: int,
    scope_id: str,
    expiration_time: float,
    signal: int,
    mono: float,
    *,
    start_time: int | None = None,
    dump: bool = False,
    kill_after: float | None = None,
) -> tuple[bytes, bytes]:
    acquire = Request(
        pid,
        scope_id,
        expiration_time,
        signal,
        mono=mono,
        start_time=start_time,
        dump=dump,
        kill_after=kill_after,
    )
    return encode(acquire), encode(Request(pid, scope_id, -1, 0))


@settings(deadline=None, max_examples=300)
@given(
    pid=st.integers(1, 2**31 - 1),
    scope_id=st.text(min_size=1, max_size=60),
    expiration_time=block_numbers,
    signal=st.one_of(st.integers(-64, MAX_SIGNAL), st.sampled_from([-(2**31), 2**31 - 1])),
    mono=block_numbers,
    start_time=st.none() | st.integers(0, MAX_START_TIME),
    dump=st.booleans(),
    kill_after=st.none() | st.floats(0, 1e6) | st.integers(0, 100),
)
def test_block_encoder_is_byte_identical_to_encode(
    *,
    pid: int,
    scope_id: str,
    expiration_time: float,
    signal: int,
    mono: float,
    start_time: int | None,
    dump: bool,
    kill_after: float | None,
) -> None:
    encode_block = block_encoder(pid, signal, start_time, dump=dump, kill_after=kill_after)
    try:
        expected = reference_block(
            pid,
            scope_id,
            expiration_time,
            signal,
            mono,
            start_time=start_time,
            dump=dump,
            kill_after=kill_after,
        )
    except ValueError as exc:  # non-finite numbers: the same refusal
        with pytest.raises(type(exc)):
            encode_block(scope_id, expiration_time, mono)
        return
    assert encode_block(scope_id, expiration_time, mono) == expected


@settings(deadline=None, max_examples=100)
@given(xs=st.lists(fast_range, min_size=20, max_size=20))
def test_block_encoder_numbers_are_float_repr(xs: list[float]) -> None:
    """The premise of block_encoder's fast path: inside its range, msgspec writes floats
    exactly as float.__repr__ (and so json.dumps, and so torch) does. (Twenty floats per
    example: the check costs microseconds, drawing an example a millisecond.)"""
    encode_block = block_encoder(1, 9)
    head = b'{"version": 1, "pid": 1, "scope_id": "s", "expiration_time": '
    for x in xs:
        acquire, _ = encode_block("s", x, x)
        number = repr(x).encode()
        assert acquire == head + number + b', "signal": 9, "mono": ' + number + b"}\n"


def test_block_encoder_on_realistic_clocks() -> None:
    """Many blocks as a client sends them: epoch deadlines and monotonic deadlines."""
    rng = random.Random(4)
    wall, mono = time.time(), time.monotonic()
    encode_block = block_encoder(4242, 9)
    for i in range(20_000):
        after = rng.choice([rng.random() * 3600, float(rng.randrange(1, 600)), 1e-3 * i])
        scope, expiration_time = f"train.py:{i % 300}#{i}", wall + after + rng.random()
        assert encode_block(scope, expiration_time, mono + after) == reference_block(
            4242, scope, expiration_time, 9, mono + after
        )


def test_block_encoder_size_limit() -> None:
    fits = scope_for_line_size(PIPE_BUF - len(', "mono": 5.0'))
    acquire, release = block_encoder(1, 9)(fits, 5.0, 5.0)
    assert len(acquire) == PIPE_BUF
    assert (acquire, release) == reference_block(1, fits, 5.0, 9, 5.0)
    with pytest.raises(RequestTooLargeError, match=f"{PIPE_BUF + 1} bytes"):
        block_encoder(1, 9)(fits + "x", 5.0, 5.0)


# -- the shared validator: what a client refuses at block entry ----------------------------


@pytest.mark.parametrize(
    ("scope_id", "signal", "timeout", "names"),
    [
        ("", 9, 1.0, "must not be empty"),
        ("x" * (MAX_SCOPE_ID_LENGTH + 1), 9, 1.0, f"MAX_SCOPE_ID_LENGTH ({MAX_SCOPE_ID_LENGTH})"),
        ("bad \ud800 scope", 9, 1.0, "not valid Unicode"),
        ("s", 999, 1.0, f"1..MAX_SIGNAL ({MAX_SIGNAL})"),
        ("s", MAX_SIGNAL + 1, 1.0, "MAX_SIGNAL"),
        ("s", 9, math.nan, "finite"),
        ("s", 9, math.inf, "finite"),
        ("s", 9, -0.5, ">= 0"),
    ],
)
def test_check_block_refuses_what_the_server_would_reject(
    scope_id: str, signal: int, timeout: float, names: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(names)):
        check_block(scope_id, signal, timeout)
    if math.isfinite(timeout) and timeout >= 0:  # the server refuses the same request
        req = Request(1, scope_id, 1e9 + timeout, signal)
        assert validate(req) is not None
        assert LineDecoder(1 << 16).feed(json_line(req)).requests == []


@pytest.mark.parametrize(
    ("scope_id", "signal"),
    [("s", 9), ("x" * MAX_SCOPE_ID_LENGTH, MAX_SIGNAL), ("é🐍", 0), ("s", -(2**31)), ("s", 1)],
)
def test_check_block_accepts_what_the_server_accepts(scope_id: str, signal: int) -> None:
    check_block(scope_id, signal, 0.0)
    req = Request(1, scope_id, 1e9, signal)
    assert validate(req) is None
    assert LineDecoder(1 << 16).feed(json_line(req)).requests == [req]


def json_line(req: Request) -> bytes:
    """``req`` as json.dumps writes it (which, unlike encode(), never refuses a field)."""
    fields = {"pid": req.pid, "scope_id": req.scope_id, "expiration_time": req.expiration_time}
    return json.dumps({**fields, "signal": req.signal}).encode() + b"\n"


def test_start_time_travels_with_an_acquire() -> None:
    req = Request(5, "s", 100.5, 9, mono=3.25, start_time=123456)
    line = encode(req)
    assert line.endswith(b'"mono": 3.25, "start_time": 123456}\n')
    assert LineDecoder().feed(line).requests == [as_decoded(req)]
    assert block_encoder(5, 9, 123456)("s", 100.5, 3.25)[0] == line
    bad = line.replace(b"123456", b"-1")
    assert LineDecoder().feed(bad).requests == []


def test_only_requests_a_block_encoder_can_write_take_the_fast_path() -> None:
    plain = Request(1, "s", 1.0, 9, mono=1.0, start_time=5, dump=True, kill_after=2.0)
    assert fits_block_encoder(plain)
    assert not fits_block_encoder(msgspec.structs.replace(plain, grace=0.0))
    assert not fits_block_encoder(msgspec.structs.replace(plain, group=True))
