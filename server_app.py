"""Flower ServerApp: wiring only (the run itself is `ovalp_flwr.ova.server.run_server`)."""

import sys
from logging import ERROR

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from ovalp_flwr.features.cache import CacheError
from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.features.encoders import EncoderError, WeightsUnavailable
from ovalp_flwr.ova.server import FederationError, run_server

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        run_server(grid, RunConfig.from_mapping(context.run_config))
    except (ConfigError, CacheError, EncoderError, WeightsUnavailable, FederationError) as err:
        # one clear line, no traceback
        log(ERROR, "%s", err)
        sys.exit(2)
