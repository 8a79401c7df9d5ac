"""`python -m ovalp_flwr.features.cache`: the cache command line (`cli`)."""

import sys

from ovalp_flwr.features.cache.cli import main

sys.exit(main())
