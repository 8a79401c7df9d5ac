"""What `summary.json` says of a run, shared by both paths (README, "Results")."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flwr
import numpy as np
import torch
from flwr.serverapp.strategy import Result

from ovalp_flwr import __version__
from ovalp_flwr.data.options import DataOptions, PartitionOptions
from ovalp_flwr.data.partition import PartitionSummary, summarize_partition, summarize_sizes
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.evaluation import CentralEvaluator
from ovalp_flwr.federation.exchange import SetupCosts
from ovalp_flwr.federation.setup import by_partition, num_partitions
from ovalp_flwr.federation.strategy import Staged


def run_summary(settings: dict, result: Result, strategy: Staged,
             evaluator: CentralEvaluator, partition: PartitionSummary, features: dict) -> dict:
    """What `summary.json` holds (README, "Results"); `settings`: the run's config, its keys and
    values (the run config's `to_dict`)."""
    accuracies = {r: float(m[p.ACCURACY]) for r, m in result.evaluate_metrics_serverapp.items()}
    last = settings["num-server-rounds"]  # 0: the start is the result
    rounds = [round_row(r, result, strategy, evaluator) for r in range(1, last + 1)]
    domains = {"domain_accuracy": {"initial": evaluator.domain_accuracy[0],
                                   "final": evaluator.domain_accuracy[last]}} \
        if evaluator.domain_names else {}
    return {**domains,
        "final_accuracy": accuracies[last],
        # picked on the test split: a figure of the curve, not a model anyone could choose
        # (the round chosen on validation rows: best_val_round, where the run holds some)
        "best_accuracy": max(accuracies[r] for r in range(min(1, last), last + 1)),
        "initial_accuracy": accuracies[0],
        "num_clients": partition.num_clients,
        "config": settings,
        "partition": partition.to_dict(),
        "features": features,
        "rounds": rounds,
        "versions": versions(),
    }


def round_row(server_round: int, result: Result, strategy: Staged,
              evaluator: CentralEvaluator) -> dict:
    """One round's row of summary.json's `rounds` (rounds.csv), from what the round recorded;
    round 0, the start: its accuracies only."""
    accuracy = float(result.evaluate_metrics_serverapp[server_round][p.ACCURACY])
    validation = ({"val_accuracy": evaluator.validation_accuracy[server_round]}
                  if server_round in evaluator.validation_accuracy else {})
    domains = ({"domain_accuracy": evaluator.domain_accuracy[server_round]}
               if evaluator.domain_names else {})
    if server_round == 0:
        return {"round": 0, "accuracy": accuracy, **validation, **domains}
    local = result.evaluate_metrics_clientapp.get(server_round)
    return {"round": server_round, "accuracy": accuracy, **validation,
            "local_accuracy": None if local is None else float(local[p.ACCURACY]),
            **strategy.rounds.get(server_round, {}),
            "server_eval_seconds": evaluator.seconds[server_round],
            "round_seconds": evaluator.round_seconds[server_round], **domains}


def partition_summary(config: PartitionOptions, clients: dict[int, dict],
                      partitions: Callable[[int], Sequence[np.ndarray]], labels: np.ndarray,
                      domains: np.ndarray, domain_names: tuple[str, ...]) -> PartitionSummary:
    """Sizes and classes per client from the server's copy of the training split (`labels`,
    `domains`; `partitions(n)`: every client's rows of it); for nodes with their own data the
    server knows only the sample counts they report (as FedAvg does), so classes stay empty."""
    by_id = [clients[node] for node in by_partition(clients)]
    kind = f"domain ({config.within_domain} within)" if config.partition == "domain" \
        else config.partition
    if not any(int(c[p.OWN_DATA]) for c in by_id):
        parts = partitions(num_partitions(clients))
        return summarize_partition(kind, [parts[int(c[p.PARTITION_ID])] for c in by_id],
                                   labels, domains, domain_names)
    return summarize_sizes(f"{kind} of node-local data", [int(c[p.NUM_EXAMPLES]) for c in by_id])


def finish_run(summary: dict, data: DataOptions, local_steps: int, clients: dict[int, dict],
               steps: int, costs: SetupCosts) -> None:
    """What both paths add to `run_summary` once the rounds are over: the clients' label noise,
    the local steps (`local-steps`, else the server's `steps`) and the set-up's costs."""
    summary["label_noise"] = label_noise_summary(data, clients)
    summary["local_steps"] = local_steps or steps or None  # None: epochs of own data
    summary["setup"] = costs.to_dict()


def label_noise_summary(config: DataOptions, clients: dict[int, dict]) -> dict:
    """What was asked for and what the clients' labels realise (counts from `describe`)."""
    examples = sum(int(c[p.NUM_EXAMPLES]) for c in clients.values())
    noisy = sum(int(c[p.NOISY_EXAMPLES]) for c in clients.values())
    return {"kind": config.label_noise, "rate": config.noise_rate,
            "realised_rate": noisy / examples if examples else 0.0}


def versions() -> dict:
    """What the run ran on."""
    return {"ovalp_flwr": __version__, "flwr": flwr.__version__, "torch": torch.__version__}
