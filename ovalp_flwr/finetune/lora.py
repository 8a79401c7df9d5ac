"""FedAvg-LoRA: LoRA adapters (the `peft` library's) on the encoder, the heads beside them;
FedAvg averages A and B apart, so the global update is (mean B)(mean A), not the mean of the
clients' B A (FLoRA's point: `flora.py`).

Targets: a transformer's attention query and value projections (MiniLM: `query`, `value`), a
ConvNet's 1x1 convolutions (EfficientNet-Lite's pointwise and head convolutions), the layers
peft wraps exactly; the depthwise convolutions stay frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ovalp_flwr.finetune.base import FinetuneMethod
from ovalp_flwr.finetune.model import EncoderClassifier
from ovalp_flwr.features.timm_compat import import_timm

ATTENTION_TARGETS = ("query", "value")


@dataclass(frozen=True)
class LoRAOptions:
    """`lora-rank` and `lora-alpha` (the update is B A x alpha / rank)."""

    rank: int = 8
    alpha: float = 16.0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def lora_targets(network: nn.Module) -> list[str]:
    """The module names LoRA wraps: attention query/value projections if the network has
    them, else every 1x1, ungrouped convolution and every Linear."""
    names = [name for name, _ in network.named_modules()]
    attention = [name for name in names if name.rsplit(".", 1)[-1] in ATTENTION_TARGETS]
    if attention:
        return attention
    return [name for name, module in network.named_modules()
            if isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d)
                                                 and module.kernel_size == (1, 1)
                                                 and module.groups == 1)]


def import_peft():
    """peft imports transformers' model classes, which import torchvision: the same guard as
    timm's (`timm_compat`)."""
    import_timm()
    import peft  # late: ~4 s with transformers, after the guard; only LoRA methods need it

    return peft


class FedAvgLoRA(FinetuneMethod):
    name = "fedavg-lora"

    def __init__(self, options: LoRAOptions) -> None:
        self.options = options

    def prepare(self, model: EncoderClassifier) -> EncoderClassifier:
        """LoRA into the network (A: peft's Kaiming init, B: zeros), only A, B and the heads train."""
        peft = import_peft()
        super().prepare(model)
        config = peft.LoraConfig(r=self.options.rank, lora_alpha=self.options.alpha,
                                 target_modules=lora_targets(model.network), lora_dropout=0.0)
        peft.inject_adapter_in_model(config, model.network)
        model.network.requires_grad_(False)
        for name, param in model.network.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                param.requires_grad_(True)
        return model.to(model.weight.device).train()

    def lora_layers(self, model: EncoderClassifier) -> dict[str, nn.Module]:
        """module name (as in the state dict) -> peft's LoRA layer (base_layer, lora_A, lora_B)."""
        peft = import_peft()
        return {f"network.{name}": module for name, module in model.network.named_modules()
                if isinstance(module, peft.tuners.lora.LoraLayer)}


def delta_weight(a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """B A x scaling in the base layer's weight shape (Linear [out, in]; 1x1 conv [out, in, 1, 1])."""
    product = b.flatten(1) @ a.flatten(1) * scaling
    return product.view(b.shape[0], a.shape[1], *a.shape[2:])
