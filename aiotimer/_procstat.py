"""Parse ``/proc/<pid>/stat`` (see proc(5)): light enough for the worker-side import."""

from __future__ import annotations

from typing import Final

__all__ = ["own_start_time", "parse_stat"]

#: 1-based index of ``starttime`` in ``/proc/<pid>/stat``.
_START_TIME_FIELD: Final[int] = 22


def parse_stat(data: bytes) -> tuple[str, int]:
    """``(state, start_time)`` from the contents of a ``/proc/<pid>/stat`` file.

    The command name (field 2) is in parentheses and may itself contain ``") "``, so the
    fixed fields start after the *last* closing parenthesis, at field 3.
    """
    fields = data[data.rindex(b")") + 2 :].split()
    return fields[0].decode("ascii"), int(fields[_START_TIME_FIELD - 3])


def own_start_time() -> int | None:
    """This process's start time (clock ticks since boot), or ``None`` without ``/proc``.

    A client sends it with each acquire, so the server never pins a process that got
    this pid after this one died.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            return parse_stat(f.read())[1]
    except OSError:
        return None
