"""``python -m kforge``: the kforge command without its console script on PATH."""

import sys

from kforge.cli import main

sys.exit(main())
