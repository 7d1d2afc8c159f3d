"""``python -m bench``: run brokerlet's benchmark."""

import sys

from bench.cli import main

sys.exit(main())
