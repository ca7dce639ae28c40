"""`python -m eagle.targets NAME_OR_PATH [--preset NAME]` (see eagle/targets/resolve.py)."""

import sys

from eagle.targets.resolve import main

sys.exit(main(sys.argv[1:]))
