"""What a run trains on the cached features: the head alone (a linear probe), or an adapter B
then the head V (the personalization study's two-layer form, features = act(B x)).

Both expose one interface, so training, personalization and evaluation never ask which it
is — and a trainable encoder can slot in later as another `FeatureModel` whose
`feature_parameters` are the encoder's:
- `features(x)`: the representation the head reads (the study's "features"; its distortion
  is measured here);
- `head_parameters()` / `feature_parameters()`: what linear probing moves, and the rest.

The head keeps the record keys `weight` / `bias` of a plain `Linear(D, K)`, so everything
written for heads (the closed-form starts, SCAFFOLD's variates, the records) reads both; the
adapter adds `adapter.weight` / `adapter.bias`.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ovalp_flwr.core.heads import HEAD_KEYS, build_head

ADAPTER_KEYS = ("adapter.weight", "adapter.bias")
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "none": lambda x: x}


class LinearProbe(nn.Linear):
    """The head alone: features are the cached (normalised) encoder features."""

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def head_parameters(self) -> list[nn.Parameter]:
        return [self.weight, self.bias]

    def feature_parameters(self) -> list[nn.Parameter]:
        return []


class AdapterHead(nn.Module):
    """B: Linear(D, k) + activation, then V: the K heads on the k adapter features."""

    def __init__(self, num_features: int, adapter_dim: int, num_classes: int,
                 activation: str = "relu") -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"adapter-activation={activation!r} is not allowed; choose one of: "
                             f"{', '.join(ACTIVATIONS)}")
        self.activation = activation
        self.adapter = nn.Linear(num_features, adapter_dim)
        self.weight = nn.Parameter(torch.empty(num_classes, adapter_dim))
        self.bias = nn.Parameter(torch.empty(num_classes))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS[self.activation](self.adapter(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.features(x), self.weight, self.bias)

    def head_parameters(self) -> list[nn.Parameter]:
        return [self.weight, self.bias]

    def feature_parameters(self) -> list[nn.Parameter]:
        return list(self.adapter.parameters())


FeatureModel = LinearProbe | AdapterHead


def initial_adapter(num_features: int, adapter_dim: int, seed: int) -> dict[str, np.ndarray]:
    """B's seeded start (torch's `Linear` init, as the heads'); its own stream of the seed."""
    layer = build_head(num_features, adapter_dim, seed + 1_000_003)
    return {f"adapter.{key}": value.detach().numpy() for key, value in layer.state_dict().items()}


def model_to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """Weights in the layout the federated records carry; copies, so that training the model
    further never changes arrays already taken (a snapshot)."""
    return {key: value.detach().cpu().numpy().copy() for key, value in model.state_dict().items()}


def model_from_numpy(arrays: dict[str, np.ndarray], device: torch.device,
                     activation: str = "relu") -> FeatureModel:
    """Rebuild the model the arrays describe: an adapter if they carry one, else the head."""
    missing = [key for key in HEAD_KEYS if key not in arrays]
    if missing:
        raise ValueError(f"model arrays lack {missing}; got keys {sorted(arrays)}")
    num_classes, head_in = arrays["weight"].shape
    if ADAPTER_KEYS[0] in arrays:
        adapter_dim, num_features = arrays[ADAPTER_KEYS[0]].shape
        if adapter_dim != head_in:
            raise ValueError(f"adapter gives {adapter_dim} features, the head reads {head_in}")
        model: FeatureModel = AdapterHead(num_features, adapter_dim, num_classes, activation)
    else:
        model = LinearProbe(head_in, num_classes)
    model.load_state_dict({key: torch.as_tensor(value) for key, value in arrays.items()})
    return model.to(device)


def clone(model: FeatureModel) -> FeatureModel:
    """An independent copy (its own parameters), on the same device."""
    return copy.deepcopy(model)
