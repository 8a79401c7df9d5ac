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


# ------------------------------------------------------------- the server optimiser's gradient


@pytest.mark.parametrize("head_type", ["ova", "softmax"])
def test_full_batch_gradient_is_autograds_of_the_runs_final_loss(head_type):
    from ovalp_flwr.core.heads import full_batch_gradient

    torch.manual_seed(0)
    features, labels = torch.randn(40, D), torch.randint(0, K, (40,))
    head = build_head(D, K, seed=3)
    loss = loss_for(head_type, 2)(head(features), labels)
    loss.backward()
    arrays = model_to_numpy(head)
    result = full_batch_gradient(arrays["weight"], arrays["bias"], features, labels, head_type)
    assert result.loss == pytest.approx(loss.item(), rel=1e-6)
    np.testing.assert_allclose(result.weight, head.weight.grad.numpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(result.bias, head.bias.grad.numpy(), rtol=1e-5, atol=1e-7)
    with torch.no_grad():  # the mean second derivative of the loss in each head's logit
        z = head(features).double()
        p = torch.sigmoid(z) if head_type == "ova" else torch.softmax(z, 1)
    np.testing.assert_allclose(result.curvature, (p * (1 - p)).mean(0).numpy(), rtol=1e-12)
    # the loss split K ways: OvA's per head (each binary problem), softmax's per label
    with torch.no_grad():
        if head_type == "ova":
            split = torch.nn.functional.binary_cross_entropy_with_logits(
                z, torch.nn.functional.one_hot(labels, K).double(), reduction="none").mean(0)
        else:
            rows = torch.nn.functional.cross_entropy(z, labels, reduction="none")
            split = torch.stack([rows[labels == k].sum() / len(labels) for k in range(K)])
    np.testing.assert_allclose(result.losses, split.numpy(), rtol=1e-12)
    assert result.losses.sum() == pytest.approx(result.loss, rel=1e-12)


@pytest.mark.parametrize("kind", ["iid", "shard", "bernoulli-dirichlet", "zipf"])
@pytest.mark.parametrize("head_type", ["ova", "softmax"])
def test_the_sample_weighted_mean_of_the_clients_gradients_is_the_centralised_one(kind, head_type):
    """On any partition, empty clients included: what makes the server's steps the centralised
    optimiser's."""
    from ovalp_flwr.core.heads import full_batch_gradient
    from ovalp_flwr.data.partition import PartitionSpec, partition_indices

    rng = np.random.default_rng(0)
    labels = rng.integers(0, K, 600)
    features = torch.from_numpy(rng.normal(size=(600, D)).astype(np.float32))
    labels_t = torch.from_numpy(labels)
    arrays = model_to_numpy(build_head(D, K, seed=2))
    parts = partition_indices(PartitionSpec(kind=kind, seed=5, classes_per_client=1,
                                            dirichlet_p=0.3, dirichlet_alpha=0.1, zipf_s=1.5),
                              labels, 20)
    assert len({len(p) for p in parts}) > 1 or kind == "iid"  # unequal clients where the partition makes them
    whole = full_batch_gradient(arrays["weight"], arrays["bias"], features, labels_t, head_type)
    total = {"loss": 0.0, "weight": 0.0, "bias": 0.0, "curvature": 0.0, "losses": 0.0}
    for rows in parts:
        if not len(rows):
            continue
        part = full_batch_gradient(arrays["weight"], arrays["bias"], features[rows],
                                   labels_t[rows], head_type)
        for key in total:
            total[key] = total[key] + len(rows) / 600 * np.asarray(getattr(part, key), np.float64)
    # equal up to float32 logits (a client's matmul rounds as the whole's, not bit for bit)
    assert total["loss"] == pytest.approx(whole.loss, rel=1e-8)
    for key in ("weight", "bias"):
        np.testing.assert_allclose(total[key], getattr(whole, key), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(total["curvature"], whole.curvature, rtol=1e-7)
    np.testing.assert_allclose(total["losses"], whole.losses, rtol=1e-7)


def test_a_gradient_vector_round_trips_and_a_wrong_length_is_refused():
    """The flat vector SecAgg+ averages: weight, bias, curvature, losses, loss."""
    from ovalp_flwr.core.heads import FullBatchGradient, full_batch_gradient

    features, labels = torch.randn(30, D), torch.randint(0, K, (30,))
    arrays = model_to_numpy(build_head(D, K, seed=1))
    result = full_batch_gradient(arrays["weight"], arrays["bias"], features, labels, "ova")
    back = FullBatchGradient.from_vector(result.to_vector(), K, D)
    for key in ("weight", "bias", "curvature", "losses"):
        np.testing.assert_array_equal(getattr(back, key), getattr(result, key))
    assert back.loss == result.loss
    empty = FullBatchGradient.empty(K, D)
    assert empty.to_vector().shape == result.to_vector().shape and not empty.to_vector().any()
    with pytest.raises(ValueError, match=f"has {K * D + 3 * K + 1} entries; got shape"):
        FullBatchGradient.from_vector(result.to_vector()[:-1], K, D)
