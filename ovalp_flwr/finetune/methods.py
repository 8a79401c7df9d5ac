"""The encoder path's methods by name (`finetune` in the run config)."""

from __future__ import annotations

from ovalp_flwr.finetune.base import FinetuneMethod
from ovalp_flwr.finetune.flora import FLoRA
from ovalp_flwr.finetune.full import FullFineTuning
from ovalp_flwr.finetune.lora import FedAvgLoRA, LoRAOptions
from ovalp_flwr.finetune.lp import LinearProbing
from ovalp_flwr.finetune.options import FinetuneOptions

METHODS = ("lp", "fedavg-lora", "flora", "full")


def make_method(config: FinetuneOptions) -> FinetuneMethod:
    """The run's method with its own hyperparameters."""
    options = LoRAOptions(config.lora_rank, config.lora_alpha)
    methods = {"lp": LinearProbing, "full": FullFineTuning,
               "fedavg-lora": lambda: FedAvgLoRA(options), "flora": lambda: FLoRA(options)}
    if config.finetune not in methods:
        raise ValueError(f"finetune={config.finetune!r} is not allowed; choose one of: "
                         f"{', '.join(METHODS)}")
    return methods[config.finetune]()
