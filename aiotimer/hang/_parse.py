"""A worker's stack dump, as text, read into frames (pure: no I/O).

Three formats come in, all of them text a worker or py-spy wrote:

* :mod:`faulthandler`'s thread stacks (the dump hook's first half), innermost frame
  first, one block per thread; the main thread is the *last* block (faulthandler walks
  the interpreter's threads newest first, and the main thread is the oldest)::

      Thread 0x00007f... (most recent call first):
        File "/srv/data.py", line 88 in load_batch

* the dump hook's asyncio section (:mod:`aiotimer.client._task_stacks`): the task
  holding the loop, its open blocks, and its await chain, outermost first::

      The loop is held by task 'Task-1', in aiotimer block(s) step
      Task 'Task-1' (running):
          open aiotimer block(s): step
          main at /srv/train.py:10

* ``py-spy dump``: one block per thread named in quotes, innermost first::

      Thread 4242 (idle): "MainThread"
          load_batch (data.py:88)

Anything else yields no frames (the report then shows the raw text alone).

A dump read from outside the worker (py-spy's) is bounded as it streams
(:class:`~aiotimer.reapers.StackTextBound`), so the parser works on a bounded copy.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Final

from aiotimer.wire import FAULT_THREAD_HEADER, SPY_THREAD_HEADER

__all__ = ["Frame", "ParsedStacks", "parse_stacks"]

_FAULT_FRAME: Final = re.compile(r'^  File "(.*)", line (\d+) in (.+)$')
_SPY_FRAME: Final = re.compile(r"^\s+(\S.*?) \((.+):(\d+)\)\s*$")
_HELD: Final = re.compile(r"^The loop is held by task ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
_TASK: Final = re.compile(r"^Task ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") \((\w+)\):$")
_TASK_FRAME: Final = re.compile(r"^    (\S.*) at (.+):(\d+)$")
_BLOCKS: Final = "    open aiotimer block(s): "


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: the function, its file and line."""

    function: str
    file: str
    line: int

    @property
    def where(self) -> str:
        """``function (file.py:LINE)``, the file by its base name."""
        return f"{self.function} ({self.file.rsplit('/', 1)[-1]}:{self.line})"


@dataclass(frozen=True, slots=True)
class ParsedStacks:
    """What a dump says: the main thread's frames and the loop-holding task's chain
    (both innermost first), the task's name and its open blocks."""

    main: tuple[Frame, ...] = ()
    task: tuple[Frame, ...] = ()
    task_name: str | None = None
    blocks: tuple[str, ...] = ()


def _name(quoted: str) -> str:
    try:
        value = ast.literal_eval(quoted)
    except (ValueError, SyntaxError):
        return quoted
    return value if isinstance(value, str) else quoted


def _threads(lines: list[str]) -> tuple[list[list[Frame]], list[Frame] | None]:
    """Every thread block's frames in order, and py-spy's ``MainThread`` if named."""
    threads: list[list[Frame]] = []
    named_main: list[Frame] | None = None
    current: list[Frame] | None = None
    for line in lines:
        if FAULT_THREAD_HEADER.match(line):
            current = []
            threads.append(current)
            continue
        spy = SPY_THREAD_HEADER.match(line)
        if spy:
            current = []
            threads.append(current)
            if spy.group(1) == "MainThread":
                named_main = current
            continue
        if current is None:
            continue
        found = _FAULT_FRAME.match(line)
        if found:
            current.append(Frame(found.group(3), found.group(1), int(found.group(2))))
            continue
        found = _SPY_FRAME.match(line)
        if found:
            current.append(Frame(found.group(1), found.group(2), int(found.group(3))))
            continue
        if not line.strip() or line.startswith("  <"):
            continue  # a blank line, or faulthandler's "<no Python frame>"
        current = None
    return threads, named_main


def _held_task(lines: list[str]) -> tuple[str | None, tuple[Frame, ...], tuple[str, ...]]:
    held: str | None = None
    for line in lines:
        found = _HELD.match(line)
        if found:
            held = _name(found.group(1))
            break
    if held is None:
        return None, (), ()
    chain: list[Frame] = []
    blocks: tuple[str, ...] = ()
    inside = False
    for line in lines:
        task = _TASK.match(line)
        if task:
            inside = _name(task.group(1)) == held
            continue
        if not inside:
            continue
        if line.startswith(_BLOCKS):
            blocks = tuple(b.strip() for b in line[len(_BLOCKS) :].split(",") if b.strip())
            continue
        found = _TASK_FRAME.match(line)
        if found:
            chain.append(Frame(found.group(1), found.group(2), int(found.group(3))))
        elif not line.startswith("    "):
            inside = False
    return held, tuple(reversed(chain)), blocks


def parse_stacks(text: str) -> ParsedStacks:
    """Read a dump's text (see the module docs); unknown text gives empty frames."""
    lines = text.splitlines()
    threads, named_main = _threads(lines)
    main = named_main if named_main is not None else (threads[-1] if threads else [])
    name, chain, blocks = _held_task(lines)
    return ParsedStacks(main=tuple(main), task=chain, task_name=name, blocks=blocks)
