"""`python -m trainer`: every option is resolved and checked before PyTorch is imported (a bad one is one
`trainer: …` line and exit 2 at once, not after seconds of imports), then the run trains."""

import sys

from .config import resolve_config
from .presets import DEFAULTS, PRESETS

cfg = resolve_config(DEFAULTS, PRESETS, sys.argv[1:])
if cfg is None:
    sys.exit(0)

from .train import run  # noqa: E402  (PyTorch: only for a configuration that passed every check)

sys.exit(run(cfg))
