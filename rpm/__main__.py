"""``python -m rpm``: the ``rpm`` command."""

import sys

from rpm.cli import main

if __name__ == "__main__":
    sys.exit(main())
