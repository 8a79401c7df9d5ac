"""LP: the heads alone fine-tuned; the features (adapter B) stay the global model's."""

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.personalize.base import LocalData, Personalizer, Task, fit


class LP(Personalizer):
    name = "lp"

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        model = clone(global_model)
        return fit(model, model.head_parameters(), data, self.hp, task)
