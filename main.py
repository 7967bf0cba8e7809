"""The Rankscope desktop app: ``python main.py [--runs-dir DIR] [--config FILE] [--start]``
(the same as the ``rankscope`` command; see app/cli.py)."""

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
