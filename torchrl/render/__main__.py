"""``python -m torchrl.render``: the ``rlrender`` console script."""

from __future__ import annotations

import sys

from torchrl.render.cli import main

if __name__ == "__main__":
    sys.exit(main())
