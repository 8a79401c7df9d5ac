"""LP-FT (Kumar et al., 2022): the heads first, then everything. Fitting the heads before the
features move keeps the early, large head gradients from distorting the features."""

from dataclasses import dataclass

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.personalize.base import FineTuning, LocalData, Personalizer, Task, fit


@dataclass(frozen=True)
class LPFTHyperparameters(FineTuning):
    lp_epochs: int = 5  # of `epochs`: the rest are FT epochs

    def check(self) -> dict[str, str]:
        bad = super().check()
        if not 0 <= self.lp_epochs <= self.epochs:
            bad["lp-epochs"] = f"use an integer in [0, epochs={self.epochs}]"
        return bad


class LPFT(Personalizer):
    name = "lp-ft"
    Hyperparameters = LPFTHyperparameters

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        model = clone(global_model)
        fit(model, model.head_parameters(), data, self.hp, task, epochs=self.hp.lp_epochs)
        return fit(model, model.parameters(), data, self.hp, task,
                   epochs=self.hp.epochs - self.hp.lp_epochs, first_epoch=self.hp.lp_epochs + 1)
