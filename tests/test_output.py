"""Writes to a stream nobody reads: bounded in time, the rest dropped and counted."""

from __future__ import annotations

import io
import os
import time

from aiotimer.cli._output import BoundedStream, bounded, write_within


def test_writes_to_a_pipe_nobody_reads_give_up_in_time() -> None:
    r, w = os.pipe()
    try:
        started = time.monotonic()
        dropped = write_within(w, "x" * 200_000, 0.2)
        assert 0 < dropped < 200_000, "the pipe took what it could"
        assert time.monotonic() - started < 2
        stream = BoundedStream(w, 0.05)
        assert stream.write("a line\n") == 7
        assert stream.dropped == 7
        os.read(r, 1 << 20)  # the reader comes back
        stream.write("next\n")
        assert os.read(r, 1 << 20) == b"\n[7 bytes dropped: the stream was not read]\nnext\n"
    finally:
        os.close(r)
        os.close(w)


def test_a_stream_without_a_descriptor_is_used_as_it_is() -> None:
    capture = io.StringIO()
    assert bounded(capture, 1.0) is capture
