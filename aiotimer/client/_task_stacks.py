"""Await chains of a loop's asyncio tasks, as text (for the worker-side stack dump).

Called from a signal handler in the main thread while the loop may be stuck anywhere:
it only reads task and coroutine objects, never runs loop code.
"""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Mapping
from typing import Final

__all__ = ["format_tasks"]

#: The longest await chain printed per task (guards against cycles).
_MAX_CHAIN: Final[int] = 200


def _where(frame: types.FrameType) -> str:
    code = frame.f_code
    return f"{code.co_qualname} at {code.co_filename}:{frame.f_lineno}"


def _short(obj: object, limit: int = 160) -> str:
    try:
        text = repr(obj)
    except Exception as exc:
        text = f"<unprintable {type(obj).__name__}: {exc!r}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _frame_of(obj: object) -> types.FrameType | None:
    for attr in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(obj, attr, None)
        if isinstance(frame, types.FrameType):
            return frame
    return None


def _awaited_by(obj: object) -> object | None:
    for attr in ("cr_await", "gi_yieldfrom", "ag_await"):
        inner: object = getattr(obj, attr, None)
        if inner is not None:
            return inner
    return None


def _running_frames(
    coro_frame: types.FrameType, current: types.FrameType | None
) -> list[types.FrameType] | None:
    """The frames from ``coro_frame`` down to ``current``, if ``current`` runs inside it."""
    frames: list[types.FrameType] = []
    f = current
    while f is not None:
        frames.append(f)
        if f is coro_frame:
            return frames[::-1]
        f = f.f_back
    return None


def _await_chain(coro: object, current: types.FrameType | None, waiter: object) -> list[str]:
    """One line per coroutine from the task's outermost one to where it is stuck.

    ``waiter`` is the future the task waits for, if known: it names the awaited object
    better than the opaque future iterator at the end of the chain.
    """
    lines: list[str] = []
    obj: object | None = coro
    for _ in range(_MAX_CHAIN):
        if obj is None:
            break
        frame = _frame_of(obj)
        if frame is None:
            if any(hasattr(obj, a) for a in ("cr_code", "gi_code", "ag_code")):
                name = getattr(obj, "__qualname__", type(obj).__name__)
                lines.append(f"{name} (finished or not started)")
            else:
                lines.append(f"awaiting {_describe_awaited(obj, waiter)}")
            break
        running = _running_frames(frame, current)
        if running is not None:
            # This coroutine is executing right now (the signal interrupted it, e.g. in
            # time.sleep): its callees are frames on the stack, not an await chain.
            lines.extend(_where(f) for f in running)
            lines.append("(running: interrupted in the innermost frame above)")
            break
        lines.append(_where(frame))
        obj = _awaited_by(obj)
        if obj is None and waiter is not None:
            lines.append(f"awaiting {_describe_awaited(None, waiter)}")
    return lines


def _describe_awaited(obj: object, waiter: object) -> str:
    if waiter is None:
        return _short(obj)
    if isinstance(waiter, asyncio.Task):
        return f"task {waiter.get_name()!r}"
    return _short(waiter)


def format_tasks(
    loop: asyncio.AbstractEventLoop, *, current_frame: types.FrameType | None = None
) -> str:
    """Every task of ``loop`` with its await chain, outermost coroutine first.

    ``current_frame`` is the frame executing in the loop's thread right now (a signal
    handler's ``frame``); the task running it is shown down to that frame.
    """
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    blocks = _open_blocks()
    lines = [f"{len(tasks)} task(s) in {_short(loop, 100)}"]
    held = False
    body: list[str] = []
    for task in tasks:
        coro = task.get_coro()
        waiter: object = getattr(task, "_fut_waiter", None)  # what a pending task awaits
        if task.done():
            state = "done"
        elif getattr(coro, "cr_running", False) or getattr(coro, "gi_running", False):
            state = "running"
        else:
            state = "pending"
        scopes = blocks.get(task, ())
        if state == "running":
            # The task executing when the dump was asked for: the one holding the loop
            # (a blocked loop's culprit, whatever block's deadline led to the reap).
            held = True
            lines.append(
                f"The loop is held by task {task.get_name()!r}"
                + (f", in aiotimer block(s) {', '.join(scopes)}" if scopes else "")
            )
        body.append(f"Task {task.get_name()!r} ({state}):")
        if scopes:
            body.append(f"    open aiotimer block(s): {', '.join(scopes)}")
        body.extend(f"    {line}" for line in _await_chain(coro, current_frame, waiter))
    if not held and tasks:
        lines.append(
            "No task is running (the loop is idle, or blocked in a plain callback: see the"
            " thread stacks)"
        )
    return "\n".join(lines + body) + "\n"


def _open_blocks() -> Mapping[object, list[str]]:
    """The open ``async with expires()`` blocks by task, if the client is loaded."""
    module = sys.modules.get("aiotimer.client._task_deadline")
    if module is None:
        return {}
    try:
        found: Mapping[object, list[str]] = module.open_blocks()
    except Exception:  # a dump must come out whatever state the client is in
        return {}
    return found
