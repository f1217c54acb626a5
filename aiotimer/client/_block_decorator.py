"""A timed block as a decorator: every call of the function is a block of its own.

:meth:`~aiotimer.client._block.Expires.__call__` checks the function and the block,
and hands :func:`timed` a maker of fresh blocks with the block's settings.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, ParamSpec, Protocol, TypeVar

from aiotimer.core import scope_at_site, scope_site

__all__ = ["Block", "block_maker", "generator_refused", "timed"]

_P = ParamSpec("_P")
_B = TypeVar("_B")


class Block(AbstractContextManager[Any], AbstractAsyncContextManager[Any], Protocol):
    """A timed block: both faces."""


def generator_refused(func: Callable[..., Any]) -> TypeError | None:
    """The ``TypeError`` for decorating ``func`` if it is a generator or async
    generator function (a call only creates the generator, so nothing of its work would
    be timed), else ``None``."""
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        return TypeError(
            f"expires() cannot decorate the generator function {func.__qualname__}: "
            "calling it only creates the generator, so its work would go untimed; "
            "put the block inside the generator, or around the loop that consumes it"
        )
    return None


def timed(func: Callable[_P, Any], new_block: Callable[[], Block]) -> Callable[_P, Any]:
    """``func``, each call of it run in a fresh block from ``new_block()``: the
    ``async with`` face for a coroutine function, else ``with``."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def timed_coroutine(*args: _P.args, **kwargs: _P.kwargs) -> Any:
            async with new_block():
                return await func(*args, **kwargs)

        return timed_coroutine

    @functools.wraps(func)
    def timed_call(*args: _P.args, **kwargs: _P.kwargs) -> Any:
        with new_block():
            return func(*args, **kwargs)

    return timed_call


def block_maker(make: Callable[[str], _B], scope: str, per_call_scope: bool) -> Callable[[], _B]:
    """A maker of fresh blocks, ``make(scope)``: each with ``scope``, or, if it is a
    default scope (``per_call_scope``), with a fresh id at its site."""
    if not per_call_scope:
        return lambda: make(scope)
    site = scope_site(scope)
    return lambda: make(scope_at_site(site))
