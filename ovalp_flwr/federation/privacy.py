"""Differential privacy for what clients send: the statistics of the closed-form start and the
heads' rounds, each a Gaussian mechanism whose privacy spent Flower's RDP accountant (Google's
`dp-accounting` underneath) reports as (ε, δ).

- **Statistics** (`dp-statistics-epsilon`, example-level): each client clips every feature
  vector to norm `dp-feature-clip` (C) before it sums; the server adds Gaussian noise to the
  summed counts, class sums, square norms and Gram matrix, each block scaled by what one example
  can change it by (1, C, C², C²). One release.
- **Rounds** (`dp-rounds-epsilon`, client-level, as Flower's
  `DifferentialPrivacyServerSideFixedClipping`): each client's update is clipped to `dp-clip`
  with Flower's `compute_clip_model_update`, the clipped updates are averaged unweighted over the
  clients sampled, and Gaussian noise of std σ·clip/sampled (Flower's `compute_stdv`) is added.
  One release per round, accounted without amplification by sampling (valid for any sampling).

The noise multiplier σ is calibrated so that the whole run spends exactly the ε asked for at
`dp-delta`. The noise is drawn from the run's seed: a DP run is reproducible.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import torch
from flwr.supercore.differential_privacy import compute_clip_model_update, compute_stdv
from flwr.supercore.privacy_accounting import (GaussianPrivacyEvent, NeighboringRelation,
                                               PrivacyConfig, SamplingMethod)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from ovalp_flwr.config import RunConfig
from ovalp_flwr.core.head_init.statistics import ClassStatistics
from ovalp_flwr.federation.replies import TrainReply

Arrays = dict[str, np.ndarray]
NOISE_STREAM = 104729  # the seed's stream for DP noise, apart from every other draw
STATISTICS_RELEASE = -1  # the noise stream's index for the statistics (rounds count from 1)


def epsilon_spent(noise_multiplier: float, releases: int, delta: float) -> float:
    """ε after `releases` Gaussian releases of noise multiplier σ (std / sensitivity), at δ."""
    accountant = RdpAccountant(PrivacyConfig(delta, 1, NeighboringRelation.ADD_OR_REMOVE_ONE,
                                             SamplingMethod.NO_AMPLIFICATION))
    accountant.compose(GaussianPrivacyEvent(noise_multiplier, 1, 1), releases)
    return accountant.get_privacy_spent().epsilon


def noise_multiplier_for(epsilon: float, releases: int, delta: float) -> float:
    """The smallest σ ≥ 0.01 (to a relative 1e-4) whose `releases` spend at most ε at δ."""
    low, high = 1e-2, 1.0
    while epsilon_spent(high, releases, delta) > epsilon:
        low, high = high, high * 2
    while high / low > 1 + 1e-4:
        middle = math.sqrt(low * high)
        if epsilon_spent(middle, releases, delta) > epsilon:
            low = middle
        else:
            high = middle
    return high


def _noise(seed: int, release: int) -> np.random.Generator:
    return np.random.default_rng([seed, NOISE_STREAM, release + 1])


def clip_rows(features: torch.Tensor, bound: float) -> torch.Tensor:
    """Each row scaled down to norm `bound` if above it: what one example adds is bounded."""
    norms = features.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return features * (bound / norms).clamp(max=1.0)


def gram_shift(std: float, size: int) -> float:
    """The spectral edge of a size x size symmetric Gaussian noise matrix of entry std `std`."""
    return 2.0 * std * math.sqrt(size)


def private_statistics(stats: ClassStatistics, noise_multiplier: float, clip: float,
                       seed: int) -> ClassStatistics:
    """The summed statistics with the Gaussian mechanism's noise: the blocks scaled by their
    sensitivities (1, C, C², C²) form one vector whose L2 sensitivity is √blocks."""
    rng = _noise(seed, STATISTICS_RELEASE)
    blocks = 4 if stats.gram is not None else 3
    scale = noise_multiplier * math.sqrt(blocks)
    counts = stats.counts + rng.normal(0.0, scale, stats.counts.shape)
    sums = stats.sums + rng.normal(0.0, scale * clip, stats.sums.shape)
    square_norms = stats.square_norms + rng.normal(0.0, scale * clip ** 2, stats.counts.shape)
    gram = None
    if stats.gram is not None:
        d, std = len(stats.gram), scale * clip ** 2
        upper = np.zeros((d, d))
        upper[np.triu_indices(d)] = rng.normal(0.0, std, d * (d + 1) // 2)
        # post-processing: symmetric noise of this std has eigenvalues down to about -2·std·√D
        # (the semicircle's edge), which would leave the ridge system indefinite; the diagonal
        # is raised by that much, so the noisy Gram stays positive definite (a ridge penalty)
        gram = stats.gram + upper + np.triu(upper, 1).T + gram_shift(std, d) * np.eye(d)
    # post-processing: a count or a square norm below zero is no one's
    return ClassStatistics(np.maximum(counts, 0.0), sums, np.maximum(square_norms, 0.0), gram)


@dataclasses.dataclass(frozen=True)
class PrivateRounds:
    """Client-level DP for one round: clipped updates, their unweighted mean over the clients
    sampled, Gaussian noise. Called where `RobustAggregation` is: returns the new heads and
    the replies the control variates may learn from (none: DP rounds run without SCAFFOLD)."""

    noise_multiplier: float
    clip: float
    seed: int

    def __call__(self, replies: Sequence[TrainReply], global_arrays: Arrays,
                 server_round: int = 0, sampled: int = 0) -> tuple[Arrays, list[TrainReply]]:
        keys = sorted(global_arrays)
        denominator = max(sampled, len(replies))  # a client without data adds a zero update
        total = [np.zeros_like(global_arrays[key], np.float64) for key in keys]
        for reply in replies:
            update = [reply.arrays[key].astype(np.float64) for key in keys]
            base = [global_arrays[key].astype(np.float64) for key in keys]
            if any(np.any(u != b) for u, b in zip(update, base)):  # Flower's divides by the norm
                compute_clip_model_update(update, base, self.clip)  # update := base + clipped delta
            for index, key in enumerate(keys):
                total[index] += update[index] - base[index]
        std = compute_stdv(self.noise_multiplier, self.clip, denominator)
        rng = _noise(self.seed, server_round)
        heads = {key: (global_arrays[key] + summed / denominator
                       + rng.normal(0.0, std, summed.shape)).astype(global_arrays[key].dtype)
                 for key, summed in zip(keys, total)}
        return heads, []


def statistics_noise(config: RunConfig) -> float:
    """σ for the start's statistics: one release spending `dp-statistics-epsilon`."""
    return noise_multiplier_for(config.dp_statistics_epsilon, 1, config.dp_delta)


def rounds_noise(config: RunConfig) -> float:
    """σ for each round: `num-server-rounds` releases spending `dp-rounds-epsilon` together."""
    return noise_multiplier_for(config.dp_rounds_epsilon, max(config.num_server_rounds, 1),
                                config.dp_delta)


def private_rounds(config: RunConfig) -> PrivateRounds | None:
    """The run's DP aggregation of the rounds, or None when they are not private."""
    if config.dp_rounds_epsilon <= 0:
        return None
    return PrivateRounds(rounds_noise(config), config.dp_clip, config.seed)


def privacy_report(config: RunConfig) -> dict:
    """What `summary.json` says of the privacy spent: per mechanism, (ε, δ) as the accountant
    computes it for the noise used, with σ, the clipping norm and the number of releases."""
    report = {}
    if config.dp_statistics_epsilon > 0:
        sigma = statistics_noise(config)
        report["statistics"] = {"level": "example", "epsilon": epsilon_spent(sigma, 1, config.dp_delta),
                                "delta": config.dp_delta, "noise_multiplier": sigma,
                                "clip": config.dp_feature_clip, "releases": 1}
    if config.dp_rounds_epsilon > 0:
        releases = max(config.num_server_rounds, 1)
        sigma = rounds_noise(config)
        report["rounds"] = {"level": "client", "epsilon": epsilon_spent(sigma, releases, config.dp_delta),
                            "delta": config.dp_delta, "noise_multiplier": sigma,
                            "clip": config.dp_clip, "releases": releases}
    return report
