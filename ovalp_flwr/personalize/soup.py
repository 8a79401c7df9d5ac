"""Soup FT (Wortsman et al., 2022, the uniform soup): several FT candidates from the global
model, at learning rates spread around the configured one, averaged parameter by parameter.
Fine-tunes of one pre-trained model stay in one loss basin, so their mean is a model too, and
it is less sensitive to the learning rate than any one candidate."""

import dataclasses

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.personalize.base import LocalData, Personalizer, Task, average, fit
from ovalp_flwr.personalize.hyperparameters import SoupHyperparameters


class Soup(Personalizer):
    name = "soup"
    Hyperparameters = SoupHyperparameters

    def learning_rates(self) -> list[float]:
        """lr·spread^t for t evenly spaced in [-1, 1]; one candidate: lr."""
        n, lr, spread = self.hp.candidates, self.hp.learning_rate, self.hp.lr_spread
        if n == 1:
            return [lr]
        return [lr * spread ** (2 * i / (n - 1) - 1) for i in range(n)]

    def candidates(self, global_model: FeatureModel, data: LocalData, task: Task
                   ) -> list[FeatureModel]:
        """The FT candidates, trained one after another on `task.generator` (so each sees its
        own batch order); nobody watches their epochs."""
        quiet = dataclasses.replace(task, on_epoch=lambda epoch, model: None)
        models = []
        for lr in self.learning_rates():
            model = clone(global_model)
            models.append(fit(model, model.parameters(), data,
                              dataclasses.replace(self.hp, learning_rate=lr), quiet))
        return models

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        soup = average(self.candidates(global_model, data, task))
        task.on_epoch(self.hp.epochs, soup)
        return soup
