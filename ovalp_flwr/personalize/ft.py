"""FT: every parameter (adapter and heads) fine-tuned on the client's data."""

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.personalize.base import LocalData, Personalizer, Task, fit


class FT(Personalizer):
    name = "ft"

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        model = clone(global_model)
        return fit(model, model.parameters(), data, self.hp, task)
