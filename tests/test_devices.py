"""The CUDA path (`pytest -m cuda` on a GPU machine): skipped where there is no GPU.

Each test runs the same computation on CUDA and on the CPU and compares: the heads' local
round, an encoder's features, a whole OvA-LP run, and a LoRA run through an encoder. A GPU
machine gets the repository alone, so nothing here reads ../shared or a weights package:
digits ship with scikit-learn, and the encoders are random-initialised."""

import numpy as np
import pytest
import torch

from ovalp_flwr.core.training import LocalSchedule, shuffle_generator, train_local

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def test_a_head_round_on_cuda_matches_the_cpu():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((200, 64), dtype=np.float32)
    labels = rng.integers(0, 10, 200)
    arrays = {"weight": np.zeros((10, 64), np.float32), "bias": np.zeros(10, np.float32)}
    schedule = LocalSchedule(epochs=2, batch_size=32, learning_rate=0.05, optimizer="sgd")
    results = [train_local(arrays, torch.from_numpy(features).to(device),
                           torch.from_numpy(labels).to(device), head_type="ova", stage=2,
                           schedule=schedule, generator=shuffle_generator(0, 1, 0))
               for device in ("cpu", "cuda")]
    assert results[0].steps == results[1].steps
    for key in arrays:
        np.testing.assert_allclose(results[0].arrays[key], results[1].arrays[key], atol=1e-4)


@pytest.mark.parametrize("tf32, tolerance", [(False, 1e-3), (True, 2e-2)])
def test_encoder_features_on_cuda_match_the_cpu(monkeypatch, tf32, tolerance):
    """cuDNN convolutions run in TF32 by default (PyTorch's default on Ampere and later): an
    H200 then differs from the CPU by up to ~7e-3 on features of order 1. In full float32 the
    CUDA path must agree to 1e-3."""
    from ovalp_flwr.features.encoders import load_encoder

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", tf32)
    images = np.random.default_rng(0).integers(0, 256, (8, 32, 32, 3), dtype=np.uint8)
    out = [load_encoder("efficientnet-lite0", device=device, image_size=64,
                        pretrained=False).encode(images)
           for device in ("cpu", "cuda")]
    np.testing.assert_allclose(out[0], out[1], atol=tolerance, rtol=tolerance)


def test_a_lora_round_runs_on_cuda(tmp_path):
    from ovalp_flwr.federation.local_grid import run_local
    from ovalp_flwr.federation.results import read_summary

    summary = read_summary(run_local({
        "finetune": "fedavg-lora", "encoder": "tiny-cnn", "head-init": "random",
        "limit-per-class": 12, "num-server-rounds": 2, "local-epochs": 1, "batch-size": 8,
        "device": "cuda", "results-dir": str(tmp_path), "run-name": "cuda"}, 3))
    assert [r["clients_trained"] for r in summary["rounds"]] == [3, 3]


def test_an_ova_lp_run_on_cuda_matches_the_cpu(tmp_path):
    """The default recipe end to end (ridge start, SCAFFOLD, two stages) on digits."""
    from ovalp_flwr.federation.local_grid import run_local
    from ovalp_flwr.federation.results import read_summary

    accuracies = []
    for device in ("cpu", "cuda"):
        summary = read_summary(run_local({
            "encoder": "pixels", "feature-cache-dir": str(tmp_path / "cache"),
            "num-server-rounds": 3, "device": device, "results-dir": str(tmp_path),
            "run-name": device}, 10))
        accuracies.append([r["accuracy"] for r in summary["rounds"]])
    np.testing.assert_allclose(accuracies[0], accuracies[1], atol=0.01)
