"""raise_open_file_limit: the soft RLIMIT_NOFILE goes up to the hard one."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest

from aiotimer._edges.limits import raise_open_file_limit


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
