"""Federated fine-tuning through the encoder, on raw data: the baselines OvA-LP's claim is
measured against (README, "Fine-tuning the encoder").

`finetune` in the run config picks the method, one small unit each:
- `lp` (lp.py): the heads on the frozen encoder's features, computed every step;
- `fedavg-lora` (lora.py): peft's LoRA on the encoder, A and B averaged apart;
- `flora` (flora.py): LoRA modules stacked, merged into every node's encoder each round;
- `full` (full.py): every encoder parameter trains, FedAvg.
The model (model.py) and the clients' raw rows (data.py) are shared; client.py and
server.py are the Flower side.
"""

from __future__ import annotations

from ovalp_flwr.config import RunConfig
from ovalp_flwr.finetune.base import FinetuneMethod
from ovalp_flwr.finetune.flora import FLoRA
from ovalp_flwr.finetune.full import FullFineTuning
from ovalp_flwr.finetune.lora import FedAvgLoRA, LoRAOptions
from ovalp_flwr.finetune.lp import LinearProbing

METHODS = ("lp", "fedavg-lora", "flora", "full")


def make_method(config: RunConfig) -> FinetuneMethod:
    """The run's method with its own hyperparameters."""
    options = LoRAOptions(config.lora_rank, config.lora_alpha)
    methods = {"lp": LinearProbing, "full": FullFineTuning,
               "fedavg-lora": lambda: FedAvgLoRA(options), "flora": lambda: FLoRA(options)}
    if config.finetune not in methods:
        raise ValueError(f"finetune={config.finetune!r} is not allowed; choose one of: "
                         f"{', '.join(METHODS)}")
    return methods[config.finetune]()
