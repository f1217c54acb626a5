"""How a public face resolves its names: lazily.

A face (``aiotimer``, ``aiotimer.core``, ``aiotimer.server``, ...) gives :func:`face_getattr`
the names it loads on first use, and binds what it returns as its module ``__getattr__``
and ``__dir__`` (PEP 562): a *lazy* name is imported from its defining module when first
asked for, then bound in the face (later lookups skip ``__getattr__``); so
``from aiotimer import expires`` loads the client and not the server.

Imports nothing of aiotimer's, so every layer's face may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["face_getattr"]


def face_getattr(
    face: str,
    namespace: dict[str, Any],
    *,
    lazy: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of face module ``face``.

    Args:
        face: the face's module name (``"aiotimer.core"``), for messages.
        namespace: the face's ``globals()``, where a lazy name is bound once loaded.
        lazy: public name -> the module that defines it (a name whose module is
            ``face.name`` is that submodule itself).

    Returns:
        ``(__getattr__, __dir__)``; ``__getattr__`` raises :class:`AttributeError` for
        any other name.
    """
    lazy = dict(lazy or {})

    def __getattr__(name: str) -> Any:
        source = lazy.get(name)
        if source is None:
            raise AttributeError(f"module {face!r} has no attribute {name!r}")
        imported = importlib.import_module(source)
        value = imported if source == f"{face}.{name}" else getattr(imported, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *lazy})

    return __getattr__, __dir__
