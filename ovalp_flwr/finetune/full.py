"""Full fine-tuning with FedAvg: every parameter of the encoder trains and travels."""

from ovalp_flwr.finetune.base import FinetuneMethod
from ovalp_flwr.finetune.model import EncoderClassifier


class FullFineTuning(FinetuneMethod):
    name = "full"

    def prepare(self, model: EncoderClassifier) -> EncoderClassifier:
        model.requires_grad_(True)
        return model
