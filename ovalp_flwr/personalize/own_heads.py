"""Own heads (ours): only the heads of the classes in the client's training labels move; the
adapter and every other class's head stay exactly the global model's. Each OvA head is its own
binary classifier, so a client can refine the heads of its classes without rewriting any other
class's. Under softmax the heads are coupled through the partition function, so freezing the
absent classes' rows leaves their decision boundaries shifted by the moved ones: weaker there."""

import torch

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.personalize.base import LocalData, Personalizer, Task, fit, squared_distance
from ovalp_flwr.personalize.hyperparameters import OwnHeadsHyperparameters


class OwnHeads(Personalizer):
    name = "own-heads"
    Hyperparameters = OwnHeadsHyperparameters

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        model = clone(global_model)
        weight, bias = model.head_parameters()
        present = torch.zeros_like(bias)
        present[data.labels.unique()] = 1.0
        mask = {weight: present[:, None].expand_as(weight), bias: present}
        anchor = clone(global_model)
        extra = (lambda m: self.hp.mu * squared_distance(m, anchor)) if self.hp.mu else None
        return fit(model, [weight, bias], data, self.hp, task, gradient_mask=mask,
                   extra_loss=extra)
