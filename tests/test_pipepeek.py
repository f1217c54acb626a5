"""Peeking at a real pipe through ``tee(2)``: a copy of what it holds, left in place."""

from __future__ import annotations

import os
import pathlib

import pytest

from aiotimer.sources._pipepeek import open_peek
from aiotimer.sources.fifo import grow_pipe

pytestmark = [pytest.mark.process, pytest.mark.timeout(10)]


def test_a_peek_copies_what_the_pipe_holds_and_leaves_it_there() -> None:
    r, w = os.pipe2(os.O_NONBLOCK)
    capacity = grow_pipe(r)
    peek = open_peek(r)
    assert peek is not None
    try:
        assert peek.peek(r) == b""  # empty
        data = bytes(range(256)) * (capacity // 256)  # a full pipe, many pages
        assert os.write(w, data) == len(data)
        assert peek.peek(r) == data
        assert peek.peek(r) == data  # again: nothing was taken out
        assert os.read(r, 1000) == data[:1000]
        assert peek.peek(r) == data[1000:]  # what is left, from its front
        assert os.read(r, len(data)) == data[1000:]
        assert peek.peek(r) == b""
    finally:
        peek.close()
        os.close(r)
        os.close(w)


def test_no_peek_for_what_is_not_a_pipe(tmp_path: pathlib.Path) -> None:
    fd = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT)
    try:
        assert open_peek(fd) is None  # the caller reads instead
    finally:
        os.close(fd)


def test_a_closed_peek_releases_its_private_pipe() -> None:
    r, w = os.pipe2(os.O_NONBLOCK)
    before = len(os.listdir("/proc/self/fd"))
    peek = open_peek(r)
    assert peek is not None
    assert len(os.listdir("/proc/self/fd")) == before + 2
    peek.close()
    peek.close()  # twice is harmless
    assert len(os.listdir("/proc/self/fd")) == before
    os.close(r)
    os.close(w)
