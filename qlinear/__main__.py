import sys

from qlinear.cli import main

sys.exit(main())
