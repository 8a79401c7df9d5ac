"""The server's scores of personalized models on its own test split (`pft-global = "server"`):
right predictions, and the summed L2 distance between each model's features and the global
model's (the study's distortion), per model. Each path says what a model is: the cached path's
`FeatureScorer` is here, the encoder path's is `finetune.server.EncoderScorer`.

The server scores N models per method on its M test rows, where the clients' cross-scoring
moved N² models to score them on M rows in all: the same arithmetic, N² - N fewer transfers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord

from ovalp_flwr.core.model import ACTIVATIONS, ADAPTER_KEYS, model_from_numpy
from ovalp_flwr.federation import protocol as p

ModelScore = tuple[int, float]  # right predictions, summed L2 feature distance to the global
ScoreModels = Callable[[dict[str, ArrayRecord]], dict[str, ModelScore]]
CHUNK_ELEMENTS = 1 << 25  # floats one batched pass holds per tensor (128 MiB)


class ServerScorer(Protocol):
    """What the phase needs of a path to score models on the server's test split."""

    num_test: int  # the server's test rows

    def against(self, global_arrays: ArrayRecord) -> ScoreModels:
        """A scorer of models against `global_arrays` (its features computed once)."""
        ...


class FeatureScorer:
    """The cached path: a model is heads (and an adapter) on the server's normalised test
    features, the very tensor its round evaluation scores (`ova.server.FeatureEvaluator`).
    Models whose adapter is the global one (LP, own-heads, every head-only model) reuse the
    global features (distortion exactly 0); the others are scored in batched passes, one
    matrix product for a chunk of adapters."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, activation: str) -> None:
        self.features, self.labels, self.activation = features, labels, activation
        self.num_test = len(labels)

    def against(self, global_arrays: ArrayRecord) -> ScoreModels:
        reference = p.from_record(global_arrays)
        with torch.inference_mode():
            global_model = model_from_numpy(reference, self.features.device, self.activation)
            global_features = global_model.features(self.features)

        def score(models: dict[str, ArrayRecord]) -> dict[str, ModelScore]:
            arrays = {name: p.from_record(record) for name, record in models.items()}
            kept = [n for n in arrays if _same_adapter(arrays[n], reference)]
            moved = [n for n in arrays if n not in kept]
            with torch.inference_mode():
                return {**self._heads_on(global_features, {n: arrays[n] for n in kept}),
                        **self._adapters(global_features, {n: arrays[n] for n in moved})}

        return score

    def _tensor(self, value: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(value)).to(self.features.device)

    def _heads_on(self, features: torch.Tensor, models: dict[str, dict[str, np.ndarray]]
                  ) -> dict[str, ModelScore]:
        """Models that read the global features: every chunk's heads in one product."""
        out: dict[str, ModelScore] = {}
        for names in _chunks(list(models), len(self.labels) * _num_classes(models)):
            weight = self._tensor(np.concatenate([models[n]["weight"] for n in names]))
            bias = self._tensor(np.concatenate([models[n]["bias"] for n in names]))
            logits = F.linear(features, weight, bias).view(len(features), len(names), -1)
            right = (logits.argmax(2) == self.labels[:, None]).sum(0)
            out.update({n: (int(r), 0.0) for n, r in zip(names, right.tolist())})
        return out

    def _adapters(self, global_features: torch.Tensor,
                  models: dict[str, dict[str, np.ndarray]]) -> dict[str, ModelScore]:
        """Models with their own adapter: a chunk's adapters in one product, then each one's
        heads on its own features."""
        out: dict[str, ModelScore] = {}
        if not models:
            return out
        width = global_features.shape[1]
        for names in _chunks(list(models), len(self.labels) * max(width, _num_classes(models))):
            adapter = self._tensor(np.concatenate([models[n][ADAPTER_KEYS[0]] for n in names]))
            shift = self._tensor(np.concatenate([models[n][ADAPTER_KEYS[1]] for n in names]))
            features = ACTIVATIONS[self.activation](F.linear(self.features, adapter, shift))
            features = features.view(len(self.labels), len(names), width)
            weight = self._tensor(np.stack([models[n]["weight"] for n in names]))
            bias = self._tensor(np.stack([models[n]["bias"] for n in names]))
            logits = torch.einsum("mck,cjk->mcj", features, weight) + bias
            right = (logits.argmax(2) == self.labels[:, None]).sum(0)
            distance = torch.linalg.vector_norm(features - global_features[:, None], dim=2).sum(0)
            out.update({n: (int(r), float(d))
                        for n, r, d in zip(names, right.tolist(), distance.tolist())})
        return out


def _same_adapter(arrays: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> bool:
    """Whether a model reads the global model's features: no adapter, or the global one."""
    return all(key not in arrays or np.array_equal(arrays[key], reference[key])
               for key in ADAPTER_KEYS)


def _num_classes(models: dict[str, dict[str, np.ndarray]]) -> int:
    return max((len(arrays["bias"]) for arrays in models.values()), default=1)


def _chunks(names: list[str], elements_per_model: int) -> list[list[str]]:
    """Names in chunks whose batched tensors stay under `CHUNK_ELEMENTS` floats."""
    size = max(1, CHUNK_ELEMENTS // max(1, elements_per_model))
    return [names[i:i + size] for i in range(0, len(names), size)]
