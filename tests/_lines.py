"""Reading a child process's stdout line by line, bounded in time.

``select`` on a pipe says whether the *descriptor* has data; a text wrapper's
``readline`` may already have pulled the next lines into its buffer, after which
``select`` waits for data that has been read. So the lines are split here, from the raw
descriptor, and what follows a line is kept for the next call.
"""

from __future__ import annotations

import os
import select
import subprocess
import time
import weakref
from typing import Any

_left: weakref.WeakKeyDictionary[subprocess.Popen[Any], bytes] = weakref.WeakKeyDictionary()


def read_line(proc: subprocess.Popen[Any], timeout: float) -> str:
    """The next line ``proc`` printed (stripped), waiting at most ``timeout`` seconds.

    Read ``proc.stdout`` only through this function.
    """
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = _left.get(proc, b"")
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"the worker printed no line within {timeout}s"
        chunk = os.read(fd, 65536)
        assert chunk, f"the worker closed its stdout; it printed {data!r}"
        data += chunk
    line, _, _left[proc] = data.partition(b"\n")
    return line.decode("utf-8", "replace").strip()
