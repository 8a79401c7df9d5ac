"""Sparse FT: only the `share` of parameter entries with the largest local-loss gradient at
the global model move. The client adapts where its data disagrees most with the global model
and leaves the rest of the federated solution exactly as it was."""

import math

import torch

from ovalp_flwr.core.model import FeatureModel, clone
from ovalp_flwr.personalize.base import LocalData, Personalizer, Task, fit
from ovalp_flwr.personalize.hyperparameters import SparseHyperparameters


class Sparse(Personalizer):
    name = "sparse"
    Hyperparameters = SparseHyperparameters

    def mask(self, model: FeatureModel, data: LocalData, task: Task
             ) -> dict[torch.nn.Parameter, torch.Tensor]:
        """1.0 on the k = ⌈share·entries⌉ entries of largest |gradient| (one full-batch pass
        over the local data, top-k over all parameters jointly), 0.0 elsewhere."""
        params = list(model.parameters())
        grads = torch.autograd.grad(task.loss(model(data.features), data.labels), params)
        scores = torch.cat([g.abs().flatten() for g in grads])
        k = min(len(scores), math.ceil(round(self.hp.share * len(scores), 9)))  # 0.1·120 is 12
        flat = torch.zeros_like(scores)
        flat[scores.topk(k).indices] = 1.0
        return {p: m.view_as(p) for p, m in zip(params, flat.split([p.numel() for p in params]))}

    def personalize(self, global_model: FeatureModel, data: LocalData, task: Task) -> FeatureModel:
        """Masked entries get zero gradient; with weight-decay = 0 (enforced) AdamW and SGD
        then leave them exactly where they are."""
        model = clone(global_model)
        return fit(model, model.parameters(), data, self.hp, task,
                   gradient_mask=self.mask(model, data, task))
