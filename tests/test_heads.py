"""Gradient facts that define OvA-LP's heads (DEVELOPERS.md, 'One-vs-all heads')."""

import numpy as np
import pytest
import torch

from ovalp_flwr.core.model import model_from_numpy, model_to_numpy
from ovalp_flwr.core.heads import (
    build_head, loss_for, ova_bce_loss, ova_positive_loss,
    softmax_loss,
)

K, D = 6, 5


def head_grads(loss_fn, labels):
    torch.manual_seed(0)
    head = build_head(D, K, seed=1)
    features = torch.randn(len(labels), D)
    loss_fn(head(features), torch.tensor(labels)).backward()
    rows_with_grad = head.weight.grad.abs().sum(1) + head.bias.grad.abs()
    return rows_with_grad > 0


def test_stage1_trains_only_the_true_class_heads():
    touched = head_grads(ova_positive_loss, [1, 3, 3])
    assert touched.tolist() == [False, True, False, True, False, False]


def test_stage2_trains_every_head():
    assert head_grads(ova_bce_loss, [1, 3, 3]).all()


def test_softmax_couples_a_head_whose_class_is_absent_but_ova_positive_does_not():
    """Class 5 is absent from the batch: softmax still pushes its head, stage-1 OvA does not."""
    assert head_grads(softmax_loss, [0, 1])[5]
    assert not head_grads(ova_positive_loss, [0, 1])[5]


def test_ova_head_gradient_is_independent_of_other_heads():
    """Changing head j's weights leaves head k's BCE gradient unchanged (no coupling)."""
    features, labels = torch.randn(8, D), torch.randint(0, K, (8,))

    def grad_of_head0(perturb_other: bool, loss_fn):
        head = build_head(D, K, seed=2)
        if perturb_other:
            with torch.no_grad():
                head.weight[3] += 5.0
        loss_fn(head(features), labels).backward()
        return head.weight.grad[0].clone()

    assert torch.allclose(grad_of_head0(False, ova_bce_loss), grad_of_head0(True, ova_bce_loss))
    assert not torch.allclose(grad_of_head0(False, softmax_loss), grad_of_head0(True, softmax_loss))


def test_bce_loss_matches_per_head_logistic_losses():
    logits, labels = torch.randn(4, K), torch.tensor([0, 2, 5, 2])
    manual = sum(
        torch.nn.functional.binary_cross_entropy_with_logits(logits[:, k], (labels == k).float())
        for k in range(K)
    )
    assert torch.isclose(ova_bce_loss(logits, labels), manual)


def test_loss_for_dispatches_by_head_and_stage():
    assert loss_for("ova", 1) is ova_positive_loss
    assert loss_for("ova", 2) is ova_bce_loss
    assert loss_for("softmax", 1) is softmax_loss
    with pytest.raises(ValueError, match="stage=3"):
        loss_for("ova", 3)


def test_head_roundtrip_and_seeded_init():
    arrays = model_to_numpy(build_head(D, K, seed=7))
    assert np.array_equal(arrays["weight"], model_to_numpy(build_head(D, K, seed=7))["weight"])
    assert not np.array_equal(arrays["weight"], model_to_numpy(build_head(D, K, seed=8))["weight"])
    rebuilt = model_to_numpy(model_from_numpy(arrays, torch.device("cpu")))
    assert all(np.array_equal(arrays[k], rebuilt[k]) for k in arrays)
