"""Local Superior Soups (Chen et al., 2024, "Local Superior Soups: A Catalyst for Model
Merging in Cross-Silo Federated Learning"): a few ingredients trained one after another, each
on the loss of a random interpolation of the ingredients so far, then averaged. Training
through the interpolations makes the whole segment between ingredients low-loss, so their
average is a good model; the affinity term keeps them in the global model's basin and the
diversity term spreads them apart, so the soup is more than one fine-tune."""

import torch
from torch.func import functional_call

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.personalize.base import LocalData, Personalizer, Task, average, squared_distance
from ovalp_flwr.personalize.hyperparameters import LSSHyperparameters
from ovalp_flwr.core.training import LocalSchedule, optimizer_step


class LSS(Personalizer):
    name = "lss"
    Hyperparameters = LSSHyperparameters

    def epochs_per_model(self) -> list[int]:
        """epochs // models each, the last one also the remainder: `epochs` in all."""
        each = self.hp.epochs // self.hp.models
        return [each] * (self.hp.models - 1) + [self.hp.epochs - each * (self.hp.models - 1)]

    def ingredients(self, global_model: FeatureModel, data: LocalData, task: Task
                    ) -> list[FeatureModel]:
        """The ingredients, each started from the previous one (the first from θ_G)."""
        anchor = clone(global_model)
        models: list[FeatureModel] = []
        for epochs in self.epochs_per_model():
            model = clone(models[-1] if models else global_model)
            self._train(model, models, anchor, data, task, epochs)
            models.append(model)
        return models

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        soup = average(self.ingredients(global_model, data, task))
        task.on_epoch(self.hp.epochs, soup)
        return soup

    def _train(self, model: FeatureModel, earlier: list[FeatureModel], anchor: FeatureModel,
               data: LocalData, task: Task, epochs: int) -> None:
        """`epochs` of mini-batches on the loss at θ_mix = Σ α_i θ_i (α ~ Dirichlet(1) per
        batch; only the current ingredient θ_m is trainable), plus the two regularisers."""
        hp = self.hp
        params = dict(model.named_parameters())
        fixed = {name: torch.stack([dict(m.named_parameters())[name].detach() for m in earlier])
                 for name in params} if earlier else {}
        step = optimizer_step(list(params.values()), LocalSchedule(
            optimizer=hp.optimizer, learning_rate=hp.learning_rate, weight_decay=hp.weight_decay))
        num_examples = len(data.labels)
        for _ in range(epochs):
            order = torch.randperm(num_examples, generator=task.generator).to(data.labels.device)
            for batch in order.split(hp.batch_size):
                mixed = params
                if earlier:
                    # Dirichlet(1): normalised Exp(1) draws; 1 − U is in (0, 1], so no log(0)
                    draws = -torch.log1p(-torch.rand(len(earlier) + 1, generator=task.generator))
                    alpha = (draws / draws.sum()).to(data.features.device)
                    mixed = {name: alpha[-1] * p + torch.tensordot(alpha[:-1], fixed[name], 1)
                             for name, p in params.items()}
                loss = task.loss(functional_call(model, mixed, (data.features[batch],)),
                                 data.labels[batch])
                loss = loss + hp.affinity * squared_distance(model, anchor)
                if earlier:
                    loss = loss - hp.diversity * sum(
                        squared_distance(model, m) for m in earlier) / len(earlier)
                for param in params.values():
                    param.grad = None
                loss.backward()
                step()
