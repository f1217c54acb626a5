"""``python -m aiotimer``: the same as the ``aiotimer`` command."""

from __future__ import annotations

import sys

from aiotimer.cli import main

if __name__ == "__main__":
    sys.exit(main())
