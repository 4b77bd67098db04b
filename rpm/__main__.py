"""``python -m rpm COMMAND``: the experiments' command line (:func:`rpm.cli.main`)."""

import sys

from rpm.cli import PROG, main

if __name__ == "__main__":
    sys.exit(main(prog=PROG))
