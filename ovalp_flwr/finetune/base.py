"""What every fine-tuning method shares: which tensors train, and how they travel.

A method is a small subclass (FL-bench's style): `prepare` makes exactly its trainable
tensors require grad (LoRA adds them first); those tensors, heads included, are the only
ones in a message (`trainable_arrays` / `load_trainable`), and the server averages them
with FedAvg unless the method brings its own strategy (FLoRA).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from ovalp_flwr.finetune.model import EncoderClassifier


class FinetuneMethod:
    """Linear probing's behaviour (only the heads train); subclasses move more."""

    name: ClassVar[str]

    def prepare(self, model: EncoderClassifier) -> EncoderClassifier:
        """Freeze the encoder; the heads train. Returns the model."""
        model.network.requires_grad_(False)
        model.weight.requires_grad_(True)
        model.bias.requires_grad_(True)
        return model

    def trainable_arrays(self, model: EncoderClassifier) -> dict[str, np.ndarray]:
        """The tensors that travel, by state-dict name: copies (a snapshot)."""
        return {name: param.detach().cpu().numpy().copy()
                for name, param in model.named_parameters() if param.requires_grad}

    def load_trainable(self, model: EncoderClassifier, arrays: dict[str, np.ndarray]) -> None:
        """Set the trainable tensors from a message; its names must be exactly them."""
        params = {name: param for name, param in model.named_parameters() if param.requires_grad}
        if set(arrays) != set(params):
            extra, missing = sorted(set(arrays) - set(params)), sorted(set(params) - set(arrays))
            raise ValueError(f"finetune={self.name!r}: the message's arrays are not the model's "
                             f"trainable tensors (extra {extra[:3]}, missing {missing[:3]})")
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(torch.as_tensor(arrays[name]))

    def frozen_state(self, model: EncoderClassifier) -> dict[str, torch.Tensor]:
        """Every tensor that does not train (tests check it is untouched by a run)."""
        trainable = {name for name, param in model.named_parameters() if param.requires_grad}
        return {name: value.detach().clone() for name, value in model.state_dict().items()
                if name not in trainable}
