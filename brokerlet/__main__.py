"""``python -m brokerlet``: the same as the ``brokerlet`` command."""

import sys

from brokerlet.cli import main

sys.exit(main())
