"""``python -m loadtests``: see :mod:`loadtests.cli`."""

import sys

if sys.argv[1:2] == ["run"]:
    # Locust monkey-patches the process on import; for the patch to take, that must happen
    # before anything imports socket, ssl or threading.
    import locust  # noqa: F401

from loadtests.cli import main

sys.exit(main())
