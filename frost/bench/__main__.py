"""`python -m frost.bench`: the harness's command line."""

import sys

from frost.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
