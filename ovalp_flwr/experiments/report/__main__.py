"""`python -m ovalp_flwr.experiments.report`: the command line is `cli.main`, kept in its own
module so importing the package (tests, benchmarks) never runs it."""

import sys

from ovalp_flwr.experiments.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
