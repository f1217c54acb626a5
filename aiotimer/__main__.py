"""``python -m aiotimer``: the same as the ``aiotimer`` command."""

from __future__ import annotations

import sys

try:
    from aiotimer.cli import main
except KeyboardInterrupt:  # Ctrl-C while the package loads: quietly, as the command does
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
