"""Rankscope's DDP engine.

This package's ``__init__``, ``config``, ``run_dir`` and ``devices`` modules import no torch, so
the desktop app can use them; everything that trains lives in the other modules.
"""

__version__ = "0.1.0"
