"""LP-FT (Kumar et al., 2022): the heads first, then everything. Fitting the heads before the
features move keeps the early, large head gradients from distorting the features."""

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.personalize.base import LocalData, Personalizer, Task, fit
from ovalp_flwr.personalize.hyperparameters import LPFTHyperparameters


class LPFT(Personalizer):
    name = "lp-ft"
    Hyperparameters = LPFTHyperparameters

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        model = clone(global_model)
        fit(model, model.head_parameters(), data, self.hp, task, epochs=self.hp.lp_epochs)
        return fit(model, model.parameters(), data, self.hp, task,
                   epochs=self.hp.epochs - self.hp.lp_epochs, first_epoch=self.hp.lp_epochs + 1)
