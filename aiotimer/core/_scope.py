"""Default scope ids and the cached process id. Pure apart from reading the caller's frame.

A default scope id is ``"{basename}:{lineno}#{n}"``: the caller's file and line, for a
human reading events, plus ``n`` from one process-wide counter, so every block gets its
own id and concurrent tasks (or threads) on the same line never collide. An async
block adds the name of its asyncio task: ``"{basename}:{lineno}#{n}@{task}"``. The reaping
side groups statistics by stripping the ``#n`` suffix (:func:`scope_site`).

Cost: one ``sys._getframe`` (no ``inspect.stack()``, which builds every frame's source
context), one dict lookup and an f-string. The ``"{basename}:{lineno}#"`` part is cached
per call site, keyed by the caller's code object and instruction offset: computing
``f_lineno`` walks the code's line table, which costs more the longer the function.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from types import CodeType, FrameType
from typing import Final

__all__ = ["current_pid", "default_scope", "scope_at_site", "scope_site", "with_task"]

_counter: Final = itertools.count(1)  # next() on it is atomic under the GIL
#: Call site (id of the code object, instruction offset) -> ("basename:lineno#", the code
#: object). Keyed by id: hashing a code object hashes its constants, ~1 us for a long
#: function. The entry holds the code object, so its id cannot be reused meanwhile.
_sites: dict[tuple[int, int], tuple[str, CodeType]] = {}
#: Past this many call sites the cache starts over (code objects created on the fly, by
#: exec or templating, would otherwise pile up in it).
_MAX_SITES: Final = 4096
_pid = os.getpid()
#: The longest file name and task name a default scope carries: so every default scope
#: id is valid by construction (within the protocol's ``MAX_SCOPE_ID_LENGTH`` of 2048,
#: valid Unicode), and a block need not check it again.
MAX_FILE_NAME: Final[int] = 1024
MAX_TASK_NAME: Final[int] = 200


def default_scope(depth: int = 1) -> str:
    """A fresh scope id naming the frame ``depth`` levels above the caller of this function.

    ``default_scope()`` called from ``f`` names the line that called ``f``.
    """
    frame = sys._getframe(depth + 1)
    entry = _sites.get((id(frame.f_code), frame.f_lasti))
    site = _new_site(frame) if entry is None else entry[0]
    return f"{site}{next(_counter)}"


def scope_at_site(site: str) -> str:
    """A fresh default scope id at ``site`` (as :func:`scope_site` returns it): each
    call of a decorated function gets its own id at the decorator's line."""
    return f"{site}#{next(_counter)}"


def _new_site(frame: FrameType) -> str:
    if len(_sites) >= _MAX_SITES:
        _sites.clear()
    code = frame.f_code
    name = os.path.basename(code.co_filename) or code.co_filename
    if not name.isascii():  # a file name undecodable in UTF-8 holds lone surrogates
        name = name.encode("utf-8", "backslashreplace").decode("utf-8")
    site = f"{name[:MAX_FILE_NAME]}:{frame.f_lineno}#"
    _sites[id(code), frame.f_lasti] = (site, code)
    return site


def scope_site(scope_id: str) -> str:
    """The call site of a default scope id (``"a.py:12#7"`` → ``"a.py:12"``; an async
    block's ``"a.py:12#7@Task-3"`` → ``"a.py:12"`` too).

    Other ids are returned unchanged.
    """
    if "@" in scope_id:  # maybe an async block's: the task name may hold any character
        found = _DEFAULT_SCOPE.match(scope_id)
        return scope_id if found is None else found[1]
    site, sep, n = scope_id.rpartition("#")
    return site if sep and n.isdigit() and ":" in site else scope_id


#: ``site#n`` or ``site#n@task``, ``site`` being ``name:line`` (the first such prefix).
_DEFAULT_SCOPE: Final = re.compile(r"(.*?:\d+)#\d+(?:@.*)?\Z", re.DOTALL)


def with_task(scope_id: str, task_name: str) -> str:
    """A default scope id naming the asyncio task it belongs to (``"a.py:12#7@Task-3"``),
    so events say which task held a block."""
    name = task_name
    if not name.isascii():  # keep the id valid Unicode (no lone surrogates)
        name = name[:MAX_TASK_NAME].encode("utf-8", "backslashreplace").decode("utf-8")
    return f"{scope_id}@{name[:MAX_TASK_NAME]}"


def current_pid() -> int:
    """This process's id, cached (and refreshed in a forked child)."""
    return _pid


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)
