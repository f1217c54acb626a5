"""Compatibility layers for code written against other timer libraries.

* :mod:`aiotimer.compat.torch` — ``torch.distributed.elastic.timer``'s names and
  signatures on aiotimer's engine (importing it does not import torch).
"""

from __future__ import annotations

__all__: list[str] = []
