"""How much input a source decodes in one step (``sources._budget``): pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiotimer.sources._budget import LINES_PER_STEP, lines_end


def test_valid_input_is_never_cut() -> None:
    chunk = b'{"pid": 4242, "scope_id": "s", "expiration_time": 1e10, "signal": 9}\n' * 470
    assert lines_end(chunk) == len(chunk)  # 32 KiB of such lines: under the limit


def test_garbage_is_cut_at_a_line_end_near_the_limit() -> None:
    chunk = b"x\n" * 16384
    end = lines_end(chunk)
    assert chunk[end - 1 : end] == b"\n"
    assert end // 2 == LINES_PER_STEP


@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"") + b"\n"), max_size=300))
def test_a_cut_holds_at_least_one_line_and_at_most_twice_the_limit(lines: list[bytes]) -> None:
    data = b"".join(lines) + b"tail without a newline"
    end = lines_end(data, most=10)
    head = data[:end]
    assert head.count(b"\n") <= 20
    if data.count(b"\n") > 10:
        assert head.endswith(b"\n") and head.count(b"\n") >= 1
    else:
        assert end == len(data)
