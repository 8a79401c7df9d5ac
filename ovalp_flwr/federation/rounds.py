"""The federated rounds' wiring, shared by both paths: the strategy, the local steps every client
takes, and what a train reply must be."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from logging import INFO

import numpy as np

from ovalp_flwr.config import RunConfig
from ovalp_flwr.core.options import WEIGHT_DECAY_PATH
from ovalp_flwr.core.decay_path import DecayPath
from ovalp_flwr.core.head_init.statistics import ClassStatistics
from ovalp_flwr.core.quasi_newton import GramPreconditioner, ServerLBFGS
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.node import local_schedule
from ovalp_flwr.federation.privacy import private_rounds
from ovalp_flwr.federation.robust import RobustAggregation
from ovalp_flwr.federation.scaffold import ControlVariates
from ovalp_flwr.federation.server_lbfgs import StagedLBFGS
from ovalp_flwr.federation.setup import num_partitions
from ovalp_flwr.federation.steps import server_step
from ovalp_flwr.federation.strategy import ReplyCheck, Staged, StagedFedAvg
from ovalp_flwr.federation.validation import check_gradient_metrics, check_train_reply
from ovalp_flwr.ops.console import say


def equal_share_steps(config: RunConfig, clients: dict[int, dict]) -> int:
    """Local steps for every client under epoch-size "equal-share" or "own-data-equal-steps":
    `local-epochs` passes over an equal share of the federation's data (its samples at the
    start over num-partitions), in batches. Clients of unequal size then take the same number
    of steps, as SCAFFOLD's analysis assumes (under "own-data-equal-steps" in bigger batches
    where a client holds more than a share: `client.local_schedule`); on equal-size
    partitions nothing changes. 0 when the run's steps come from elsewhere (`local-steps`, or
    epochs of each client's own data)."""
    if config.epoch_size == "own-data" or config.local_steps or config.server_steps:
        return 0
    share = sum(int(c[p.NUM_EXAMPLES]) for c in clients.values()) / num_partitions(clients)
    steps = config.local_epochs * max(1, math.ceil(share / config.batch_size))
    say(INFO, "epoch-size %s: every client takes %s local steps per round", config.epoch_size,
        steps)
    return steps


def train_reply_check(config: RunConfig, clients: dict[int, dict], steps: int) -> ReplyCheck:
    """What a train reply must be (`validation.check_train_reply`): the global model's arrays,
    finite; the sample count its node described (`clients`, late nodes included); the steps
    the run's local schedule takes on them."""
    round_config = {p.LOCAL_STEPS: steps} if steps else {}

    @functools.cache
    def planned(examples: int) -> int:  # the same few counts, round after round
        if config.server_steps:
            return 0  # a gradient, no local steps
        return local_schedule(config.training, round_config, examples).num_steps(examples)

    def check(node: int, arrays: dict[str, np.ndarray], metrics: dict,
              global_arrays: dict[str, np.ndarray]) -> str | None:
        if node not in clients:
            return "the node is not in the federation"
        examples = int(clients[node][p.NUM_EXAMPLES])
        # finiteness: the strategy checks it once, on the average (a sum is finite only if
        # every term is), and looks for the culprit only when it is not
        reason = check_train_reply(arrays, metrics, global_arrays, examples, planned(examples),
                                   finite=False)
        if reason is None and config.server_steps:
            return check_gradient_metrics(metrics, len(global_arrays["bias"]))
        return reason

    return check


def weight_cap(multiple: float, sizes: dict[int, int] | None) -> float | None:
    """The most weight one reply may have: `multiple` x the median count the nodes holding data
    described (`weight-cap`); None without a cap. The median, which a minority of forged
    counts cannot move far, bounds what a stated count buys (stats-count: ten times its rows)."""
    held = [size for size in (sizes or {}).values() if size > 0]
    if multiple <= 0 or not held:
        return None
    return multiple * float(np.median(held))


def make_strategy(config: RunConfig, strategy_class: Callable[..., Staged] | None = None,
                  statistics: ClassStatistics | None = None, sizes: dict[int, int] | None = None,
                  **wiring) -> Staged:
    """The run's strategy: FedAvg or FedAdam, with its staging and quantity-skew options (or
    `strategy_class` with those options: FLoRA's); or the server's L-BFGS, preconditioned by
    the federation's `statistics` (with their Gram matrix), over the rows each node described
    (`sizes`: node -> sample count)."""
    robust = (RobustAggregation(config.robust_aggregation, config.robust_fraction)
              if config.robust_aggregation != "none" else None)
    options = dict(
        stage_for_round=config.stage_for_round,
        seed=config.seed,
        fraction_train=config.fraction_train,
        fraction_evaluate=config.fraction_evaluate,
        federated_validation=config.validation_rows == "clients",
        aggregation_weights=config.aggregation_weights,
        max_weight=weight_cap(config.weight_cap, sizes),
        exclude_after=config.exclude_after_rejections,
        # under DP rounds the robust rule works inside DP's clipping, as its wrapper's inner part
        robust=robust if config.dp_rounds_epsilon <= 0 else None,
        privacy=private_rounds(config.privacy, config.rounds, max(len(sizes or {}), 1), robust),
        secret_sampling=config.dp_rounds_epsilon > 0,
        control_variates=(ControlVariates(config.learning_rate,
                                          held_by_clients=config.scaffold_variates == "clients")
                          if config.drift_correction == "scaffold" and not config.server_steps
                          else None),
        **wiring,
    )
    if config.server_steps:
        if statistics is None or statistics.gram is None:
            raise ValueError('server-optimizer="lbfgs" needs the clients\' summed statistics '
                             "with their Gram matrix")
        options["extra_train_config"] = {**options.get("extra_train_config", {}), p.GRADIENT: 1}
        optimizer = ServerLBFGS(GramPreconditioner(statistics, config.first_weight_decay),
                                memory=config.lbfgs_memory, separable=config.head == "ova")
        path = (DecayPath(WEIGHT_DECAY_PATH, config.lbfgs_path_rounds)
                if config.weight_decay == "auto" else None)
        return StagedLBFGS(optimizer=optimizer, weight_decay=config.first_weight_decay, path=path,
                           sizes=sizes or {}, patience=config.lbfgs_patience,
                           secure=config.statistics_aggregation == "secagg+", **options)
    if strategy_class is not None:
        return strategy_class(**options)
    return StagedFedAvg(step=server_step(config.rounds), **options)
