"""``python -m qlinear.tools.bench``: the same as ``qlinear bench``."""

import sys

from .command import main

sys.exit(main())
