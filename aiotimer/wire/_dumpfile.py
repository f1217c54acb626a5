"""The dump-file format shared by a worker's dump hook and the server's collector: where
a worker's dump file lies, its header tag, its end marker and its size cap. Pure: no I/O
beyond reading the environment.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
from pathlib import Path
from typing import Final

__all__ = [
    "DEFAULT_DUMP_SIGNAL",
    "END_MARKER",
    "ENV_DUMP_DIR",
    "FAULT_THREAD_HEADER",
    "HEADER_TAG",
    "MAX_DUMP_BYTES",
    "SPY_THREAD_HEADER",
    "dump_dir_for",
    "dump_path_for",
]

#: The environment variable naming the directory of dump files (worker and server alike).
ENV_DUMP_DIR: Final[str] = "AIOTIMER_DUMP_DIR"
#: The signal a worker's hook listens to unless told otherwise.
DEFAULT_DUMP_SIGNAL: Final[int] = int(signal.SIGUSR1)
#: The last line of a complete dump.
END_MARKER: Final[str] = "=== end of aiotimer dump ==="
#: The first word of a dump file's header line.
HEADER_TAG: Final[str] = "aiotimer-dump-hook"
#: The most a reader takes of one dump.
MAX_DUMP_BYTES: Final[int] = 4 * 1024 * 1024


def dump_dir_for(dump_dir: str | os.PathLike[str] | None = None) -> Path:
    """The dump directory: ``dump_dir``, else ``$AIOTIMER_DUMP_DIR``, else
    ``aiotimer-dumps-<uid>`` in the system temp dir (``tempfile.gettempdir()``, which
    follows ``$TMPDIR``: give the worker and the server the same environment, or set
    ``AIOTIMER_DUMP_DIR`` for both)."""
    if dump_dir is not None:
        return Path(dump_dir)
    env = os.environ.get(ENV_DUMP_DIR)
    if env:
        return Path(env)
    return Path(tempfile.gettempdir()) / f"aiotimer-dumps-{os.geteuid()}"


def dump_path_for(pid: int, dump_dir: str | os.PathLike[str] | None = None) -> Path:
    """The dump file of worker ``pid``: ``<dir>/aiotimer-dump-<pid>.txt`` in
    :func:`dump_dir_for` ``(dump_dir)``."""
    return dump_dir_for(dump_dir) / f"aiotimer-dump-{pid}.txt"


#: A thread's header in :mod:`faulthandler`'s stacks (the dump hook's first half).
FAULT_THREAD_HEADER: Final = re.compile(
    r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):"
)
#: A thread's header in ``py-spy dump``'s output; its group is the thread's name.
SPY_THREAD_HEADER: Final = re.compile(r'^Thread (?:0x)?[0-9a-fA-F]+ \([^)]*\)(?:: "(.*)")?\s*$')
