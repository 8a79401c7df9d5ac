"""Proximal FT: FT with μ‖θ − θ_G‖² added to the loss (FedProx's term, applied after
federation), which holds the personalized model near the global one."""

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.personalize.base import LocalData, Personalizer, Task, fit, squared_distance
from ovalp_flwr.personalize.hyperparameters import ProximalHyperparameters


class Proximal(Personalizer):
    name = "proximal"
    Hyperparameters = ProximalHyperparameters

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        model = clone(global_model)
        anchor = clone(global_model)
        return fit(model, model.parameters(), data, self.hp, task,
                   extra_loss=lambda m: self.hp.mu * squared_distance(m, anchor))
