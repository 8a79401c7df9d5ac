"""A classifier that trains through its encoder: the encoder's network with its own
preprocessing and pooling, then K heads (`weight` / `bias`, as on the cached path).

It has the interface of `ovalp_flwr.core.model`'s feature models (`features`, `head_parameters`,
`feature_parameters`), so the local loop (`training.fit`) and the personalization methods
run on it unchanged. Its input is one tensor per batch, indexable by rows like cached
features: uint8 images [B, H, W, 3] (preprocessed inside, as the encoder does), or a text's
token ids and attention mask stacked [B, 2, L] (cut to the batch's longest text inside).

The network stays in eval mode even while it trains: BatchNorm keeps its running statistics
and dropout is off, so every method's frozen tensors are bit-identical after a run and only
parameters (never buffers) need to travel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ovalp_flwr.features.encoders._common import NetworkEncoder
from ovalp_flwr.core.heads import build_head


class EncoderClassifier(nn.Module):
    """encoder network -> pooled features -> K linear heads."""

    def __init__(self, encoder: NetworkEncoder, num_classes: int) -> None:
        super().__init__()
        self.network = encoder.model  # the only registered module: its tensors are the model's
        self.source = encoder  # preprocessing and pooling (not a Module: nothing registered twice)
        self.weight = nn.Parameter(torch.zeros(num_classes, encoder.feature_dim))
        self.bias = nn.Parameter(torch.zeros(num_classes))

    @property
    def modality(self) -> str:
        return self.source.modality

    def features(self, x: torch.Tensor) -> torch.Tensor:
        if self.modality == "image":
            pixels = self.source.preprocess(x.permute(0, 3, 1, 2).float().div(255.0))
            return self.source.features(pixels)
        ids, mask = x[:, 0], x[:, 1]
        width = int(mask.sum(1).max())
        return self.source.features(ids[:, :width], mask[:, :width])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.features(x), self.weight, self.bias)

    def head_parameters(self) -> list[nn.Parameter]:
        return [self.weight, self.bias]

    def feature_parameters(self) -> list[nn.Parameter]:
        """What moves besides the heads: the encoder's trainable tensors (LoRA, or all)."""
        return [param for param in self.network.parameters() if param.requires_grad]

    def train(self, mode: bool = True) -> "EncoderClassifier":
        super().train(mode)
        self.network.eval()  # frozen BatchNorm statistics, no dropout (module docstring)
        return self


def build_classifier(network: NetworkEncoder, num_classes: int, seed: int,
                     device: torch.device) -> EncoderClassifier:
    """The encoder (`load_encoder`'s) with seeded heads (torch's Linear init, as the cached
    path's `heads.build_head`)."""
    model = EncoderClassifier(network, num_classes)
    head = build_head(network.feature_dim, num_classes, seed)
    with torch.no_grad():
        model.weight.copy_(head.weight)
        model.bias.copy_(head.bias)
    network.device = device
    return model.to(device).train()
