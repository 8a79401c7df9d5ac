"""Flower ServerApp: wiring only. The path a run takes is chosen here, once: the cached features
(`ovalp_flwr.ova.server`, `finetune = "none"`) or the encoder (`ovalp_flwr.finetune.server`)."""

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ovalp_flwr.config import ConfigError, RunConfig
from ovalp_flwr.core.memory import return_large_frees
from ovalp_flwr.features.cache import CacheError
from ovalp_flwr.features.encoders import EncoderError, WeightsUnavailable
from ovalp_flwr.federation.errors import FederationError, refuse
from ovalp_flwr.federation.polling import prompt_replies
from ovalp_flwr.federation.runtime_env import say_if_flower_installed
from ovalp_flwr.finetune.server import run_finetune
from ovalp_flwr.ova.server import run_ova


def run_server(grid: Grid, config: RunConfig) -> Path:
    """One run on `grid`; returns its results folder."""
    if config.finetune == "none":
        return run_ova(grid, config)
    return run_finetune(grid, config)


# what a run stops on with one line: a bad config, cache or encoder, a federation that cannot run it
KNOWN_ERRORS = (ConfigError, CacheError, EncoderError, WeightsUnavailable, FederationError)

return_large_frees()  # every client's statistics pass through: freed, back to the system
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    say_if_flower_installed()  # a run on packages Flower reinstalled for it (CUDA torch, GBs)
    try:
        # replies pulled promptly, not 3 s apart as Flower does (federation/polling.py)
        run_server(prompt_replies(grid), RunConfig.from_mapping(context.run_config))
    except KNOWN_ERRORS as err:
        # one clear line for the user, and the run ends failed with it (not completed)
        raise refuse(err) from None
