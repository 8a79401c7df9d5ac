"""Flower ServerApp: wiring only. The path a run takes is chosen here, once: the cached features
(`ovalp_flwr.ova.server`, `finetune = "none"`) or the encoder (`ovalp_flwr.finetune.server`)."""

import sys
from logging import ERROR
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.core.memory import return_large_frees
from ovalp_flwr.features.cache import CacheError
from ovalp_flwr.features.encoders import EncoderError, WeightsUnavailable
from ovalp_flwr.federation.exchange import FederationError
from ovalp_flwr.federation.polling import fast_replies
from ovalp_flwr.finetune.server import run_finetune
from ovalp_flwr.ova.server import run_ova


def run_server(grid: Grid, config: RunConfig) -> Path:
    """One run on `grid`; returns its results folder."""
    if config.finetune == "none":
        return run_ova(grid, config)
    return run_finetune(grid, config)


return_large_frees()  # every client's statistics pass through: freed, back to the system
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        # replies pulled 0.1 s apart, not Flower's 3 s (federation/polling.py)
        run_server(fast_replies(grid), RunConfig.from_mapping(context.run_config))
    except (ConfigError, CacheError, EncoderError, WeightsUnavailable, FederationError) as err:
        # one clear line, no traceback
        log(ERROR, "%s", err)
        sys.exit(2)
