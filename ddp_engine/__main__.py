"""``python -m ddp_engine``: the engine's command line, :mod:`ddp_engine.launch.cli`."""

import sys

from ddp_engine.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
