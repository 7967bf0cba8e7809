"""torchrun's target, under the name every command and script uses: ``torchrun
--nproc-per-node N -m ddp_engine.worker --config FILE``. The rank's code is
:mod:`ddp_engine.rank.worker`; this name stays the same wherever that code lives.
"""

import sys

from ddp_engine.rank.worker import main  # arms the parent-death signal first

if __name__ == "__main__":
    sys.exit(main())
