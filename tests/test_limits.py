"""raise_open_file_limit: the soft RLIMIT_NOFILE goes up to the hard one."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import pytest

from aiotimer._edges.limits import DescriptorReserve, raise_open_file_limit


@pytest.fixture
def restore_limits() -> Iterator[tuple[int, int]]:
    saved = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield saved
    resource.setrlimit(resource.RLIMIT_NOFILE, saved)


def test_the_soft_limit_is_raised_to_the_hard_one(restore_limits: tuple[int, int]) -> None:
    hard = restore_limits[1]
    if hard == resource.RLIM_INFINITY or hard <= 64:
        pytest.skip(f"needs a finite hard limit above 64, not {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
    assert raise_open_file_limit() == (hard, hard)
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    assert raise_open_file_limit() == (hard, hard)  # already there: a no-op


def test_a_reserve_says_whether_that_many_descriptors_are_free(
    restore_limits: tuple[int, int],
) -> None:
    hard = restore_limits[1]
    open_now = len(os.listdir("/proc/self/fd"))
    soft = open_now + 40
    if hard != resource.RLIM_INFINITY and hard < soft:
        pytest.skip(f"the hard limit {hard} is below {soft}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    reserve = DescriptorReserve(10)
    held: list[int] = []
    try:
        with open(os.devnull) as probe:
            assert reserve.leaves_room(probe.fileno())
            while reserve.leaves_room(probe.fileno()):
                held.append(os.dup(probe.fileno()))
            assert not reserve.leaves_room(probe.fileno())
            os.close(held.pop())  # exactly one short before
            assert reserve.leaves_room(probe.fileno())
    finally:
        for fd in held:
            os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == open_now  # the probes are all closed


def test_a_reserve_is_at_most_a_quarter_of_a_low_limit(restore_limits: tuple[int, int]) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (100, restore_limits[1]))
    assert DescriptorReserve.for_limit(64).count == 25
    assert DescriptorReserve.for_limit(8).count == 8
    with pytest.raises(ValueError, match=">= 0"):
        DescriptorReserve(-1)
