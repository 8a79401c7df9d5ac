"""The encoder path's ServerApp run (`finetune` set): describe, seeded start, the staged
FedAvg (or FLoRA) rounds over the method's trainable tensors, the server's evaluation on the
raw test split, and the same results files as the cached path (`ovalp_flwr.ova.server`).
`server_app.py` chooses this path when `finetune` is set."""

from __future__ import annotations

import functools
from collections.abc import Callable
from logging import INFO
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord
from flwr.serverapp import Grid

from ovalp_flwr.config import RunConfig, check_num_clients
from ovalp_flwr.federation import protocol as p
from ovalp_flwr.federation.evaluation import CentralEvaluator
from ovalp_flwr.federation.exchange import SetupCosts, wait_for_nodes
from ovalp_flwr.federation.node import node_data
from ovalp_flwr.runs.pipeline import Prepared, RunPath, run
from ovalp_flwr.federation.setup import check_feature_space, describe_clients
from ovalp_flwr.federation.strategy import Staged
from ovalp_flwr.federation.summary import partition_summary
from ovalp_flwr.finetune.client import Setup, feature_space, load_parameters, setup
from ovalp_flwr.finetune.flora import FLoRA, StagedFLoRA
from ovalp_flwr.finetune.model import EncoderClassifier
from ovalp_flwr.ops.console import say
from ovalp_flwr.personalize.scoring import ModelScore, ScoreModels

EVAL_BATCH = 256


def run_finetune(grid: Grid, config: RunConfig) -> Path:
    """One fine-tuning run; returns its results folder."""
    return run(grid, EncoderPath(config))


class EncoderPath(RunPath):
    """The encoder path's own steps in the shared run (`runs.pipeline`): the seeded
    model, describe, and the method's trainable tensors as what travels."""

    def __init__(self, config: RunConfig) -> None:
        super().__init__(config)
        # FLoRA's nodes hold the stacks they merged, and its strategy the stacks it sent: a
        # round's checkpoint would not be all a resume needs (config refuses resume there)
        self.checkpoints = config.finetune != "flora"

    def prepare(self, grid: Grid, released: dict[str, np.ndarray]) -> Prepared:
        config = self.config  # nothing is released under DP on this path: `released` is empty
        self.built = built = setup(config.data, config.finetuning, config.seed, config.device)
        self.initial = initial = {key: value.copy() for key, value in built.initial.items()}
        nodes = wait_for_nodes(grid)
        check_num_clients(len(nodes), len(built.data.train.labels))
        costs = SetupCosts()
        clients = describe_clients(grid, nodes, costs=costs)
        space = feature_space(config.data, config.finetuning, config.seed)
        check_feature_space(clients, space,
                            differs="train another model or data than the server's", hint="")
        data = built.data
        partition = partition_summary(config.partitioning, clients,
                                      lambda n: built.partitions(node_data(config).spec, n),
                                      data.train.labels, data.train.domains, data.domain_names)
        say(INFO, "finetune %s: %d trainable tensors, %.2f M of %.2f M parameters travel; "
            "partition %s", config.finetune, len(initial), _millions(initial),
            _millions(built.model.state_dict()), partition)
        features = {"raw": space, "num_classes": data.num_classes,
                    "train_size": len(data.train.labels), "test_size": len(data.test.labels)}
        return Prepared(nodes, clients, initial, partition, costs, features)

    def strategy_wiring(self, prepared: Prepared) -> dict:
        return {"strategy_class": _strategy_class(self.built, self.initial)}

    def evaluator(self, strategy: Staged, prepared: Prepared) -> CentralEvaluator:
        return EncoderEvaluator(self.built, self.config, _loader(self.built, strategy))

    def summarize(self, summary: dict, strategy: Staged, evaluator: CentralEvaluator,
                  prepared: Prepared, head_init: dict) -> None:
        initial, model = self.initial, self.built.model
        summary["finetune"] = {"method": self.config.finetune,
                               "trainable_tensors": len(initial),
                               "trainable_parameters": int(sum(a.size for a in initial.values())),
                               "model_parameters": int(sum(t.numel() for t in
                                                           model.state_dict().values()))}

    def scorer(self, evaluator: CentralEvaluator, prepared: Prepared) -> ScoreModels:
        return EncoderScorer(evaluator)

    def last_line(self, summary: dict, out: Path) -> str:
        config = self.config
        return (f"final accuracy {summary['final_accuracy']:.4f} after "
                f"{config.num_server_rounds} rounds (finetune {config.finetune}, {config.head}, "
                f"{config.partition}); results in {out}")


def _millions(arrays) -> float:
    return sum(int(np.prod(tuple(a.shape))) for a in arrays.values()) / 1e6


def _strategy_class(built: Setup, initial: dict[str, np.ndarray]) -> Callable | None:
    """FLoRA's own strategy (its fresh LoRA modules: the start's), or None: Staged FedAvg."""
    if not isinstance(built.method, FLoRA):
        return None
    fresh = {k: v for k, v in initial.items() if ".lora_A." in k or ".lora_B." in k}
    return functools.partial(StagedFLoRA, flora=built.method, fresh=fresh)


def _loader(built: Setup, strategy) -> Callable[[ArrayRecord], None]:
    """How the server's model takes the global arrays (FLoRA: and the merged update)."""

    def load(arrays: ArrayRecord) -> None:
        if isinstance(strategy, StagedFLoRA):
            built.method.apply(built.model, strategy.delta)
        built.method.load_trainable(built.model, p.from_record(arrays))

    return load


class EncoderEvaluator(CentralEvaluator):
    """Scores the global model on the raw test split, in batches through the encoder."""

    def __init__(self, built: Setup, config: RunConfig, load: Callable[[ArrayRecord], None]) -> None:
        self.built, self.load = built, load
        self.device = built.model.weight.device
        super().__init__(config.num_server_rounds, config.stage_for_round,
                         torch.from_numpy(built.data.test.labels).to(self.device),
                         torch.from_numpy(built.data.test.domains).to(self.device),
                         built.data.domain_names)

    def _right(self, arrays: ArrayRecord) -> torch.Tensor:
        self.load(arrays)
        model, inputs = self.built.model, self.built.data.test.inputs
        with torch.inference_mode():
            predicted = torch.cat([model(inputs[i:i + EVAL_BATCH].to(self.device)).argmax(1)
                                   for i in range(0, len(inputs), EVAL_BATCH)])
        return predicted == self.labels


class EncoderScorer:
    """The encoder path's `personalize.scoring.ServerScorer`: every model is the global model
    with its own tensors loaded over it (as the clients' `score_personalized` does), run through
    the encoder on the server's raw test split in batches, and put back after its scoring."""

    def __init__(self, evaluator: EncoderEvaluator) -> None:
        self.evaluator = evaluator
        self.num_test = len(evaluator.labels)

    def against(self, global_arrays: ArrayRecord) -> ScoreModels:
        self.evaluator.load(global_arrays)
        model = self.evaluator.built.model
        reference = {n: q.detach().clone() for n, q in model.named_parameters()}
        global_features = self._features(model)

        def score(models: dict[str, ArrayRecord]) -> dict[str, ModelScore]:
            out = {}
            for name, record in models.items():
                arrays = p.from_record(record)
                load_parameters(model, arrays)
                try:
                    out[name] = self._score(model, global_features)
                finally:
                    load_parameters(model, {n: reference[n] for n in arrays})
            return out

        return score

    def _batches(self) -> list[torch.Tensor]:
        inputs = self.evaluator.built.data.test.inputs
        return [inputs[i:i + EVAL_BATCH] for i in range(0, len(inputs), EVAL_BATCH)]

    def _features(self, model: EncoderClassifier) -> list[torch.Tensor]:
        with torch.inference_mode():
            return [model.features(batch.to(self.evaluator.device)) for batch in self._batches()]

    def _score(self, model: EncoderClassifier, global_features: list[torch.Tensor]) -> ModelScore:
        """Right predictions and summed feature distance to the global model's, batch by batch."""
        right, distance = 0, 0.0
        labels = self.evaluator.labels.split(EVAL_BATCH)
        with torch.inference_mode():
            for batch, reference, truth in zip(self._batches(), global_features, labels):
                features = model.features(batch.to(self.evaluator.device))
                logits = torch.nn.functional.linear(features, model.weight, model.bias)
                right += int((logits.argmax(1) == truth).sum())
                distance += float(torch.linalg.vector_norm(features - reference, dim=1).sum())
        return right, distance
