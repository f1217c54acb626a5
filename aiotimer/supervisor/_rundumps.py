"""The run's dump directory: where its workers' stack dumps go, made for the run unless
one is given, and removed with the run unless its files are to be kept."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from aiotimer.wire import ENV_DUMP_DIR

__all__ = ["RunDumps"]

logger = logging.getLogger("aiotimer")


class RunDumps:
    """One dump directory per run (see :meth:`place` and :meth:`remove`)."""

    __slots__ = ("_given", "_keep", "_own")

    def __init__(self, given: str | os.PathLike[str] | None, *, keep: bool) -> None:
        self._given = given
        self._keep = keep
        self._own: Path | None = None  # the directory made for the run

    def place(self, env: MutableMapping[str, str], parent: str | None, tag: str) -> Path:
        """The run's dump directory: given, else ``env``'s ``AIOTIMER_DUMP_DIR``, else
        made now under ``parent``; exported to the workers through ``env``."""
        given = self._given if self._given is not None else env.get(ENV_DUMP_DIR)
        if given:
            where = Path(given)
        else:
            where = Path(tempfile.mkdtemp(prefix=f"aiotimer-dumps-{tag}-", dir=parent))
            self._own = where
        env[ENV_DUMP_DIR] = str(where)
        return where

    def remove(self) -> None:
        """Remove the directory made for the run (none given), unless its files are to
        be kept and it holds some. Idempotent."""
        dumps, self._own = self._own, None
        if dumps is None:
            return
        if self._keep and any(dumps.iterdir()):
            logger.info("the workers' dump files are kept in %s", dumps)
        else:
            shutil.rmtree(dumps, ignore_errors=True)
