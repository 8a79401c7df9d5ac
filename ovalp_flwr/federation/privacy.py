"""Differential privacy for what clients send: the statistics of the closed-form start and the
heads' rounds, each a Gaussian mechanism, composed by one RDP accountant per run (Flower's
`RdpAccountant`, Google's `dp-accounting` underneath) into the (ε, δ) the run spends.

The trust model is central DP, but for the statistics under SecAgg+: the server is trusted with
what clients send (their statistics, their updates, their sample counts); what is protected is
everything the run *releases* (the model, summary.json, rounds.csv). With
`statistics-aggregation = "secagg+"` the statistics' noise is distributed: each client holding
data adds 1/m of its variance (m: the clients holding data) before SecAgg+ masks its vector,
and the server, which sees only the sum, sees it noisy. SecAgg+ here refuses a sum that misses
any client, so the shares never add up to less than one release's noise. Who takes part and how many rows each holds are public (the
server plans with the counts `describe` gives), so neighbouring datasets differ in the *value* of
one record, not its presence: replace-one, of an example for the statistics and of a client's
whole data for the rounds. The noise comes from the operating system's entropy, fresh for every
release: nothing a client or summary.json sees (the run's seed included) can regenerate it.

- **Statistics** (`dp-statistics-epsilon`, example-level): each client clips every feature
  vector to norm `dp-feature-clip` (C) before it sums; the server adds Gaussian noise to the
  summed counts, class sums, square norms and Gram matrix, each block scaled by what replacing
  one example can change it by (√2, 2C, √2·C², √2·C²). One release.
- **Rounds** (`dp-rounds-epsilon`, client-level, Flower's
  `DifferentialPrivacyServerSideFixedClipping` under replace-one): each client's update is
  clipped to `dp-clip` with Flower's `compute_clip_model_update`, the clipped updates are
  averaged unweighted over the clients sampled, and Gaussian noise of std σ·2·clip/sampled
  (Flower's `compute_stdv` at the replace-one sensitivity 2·clip) is added. One release per
  round, accounted without amplification by sampling (valid for any sampling).

Each mechanism's noise multiplier σ is calibrated so that it alone spends the ε asked for at
`dp-delta`; the run's accountant composes them. A client-level guarantee covers any one example
too, so the example-level ε composes every release; the client-level ε only the rounds (the
statistics' noise covers one example, not a client's data). A release of client data without
noise (a start from exact statistics, rounds without noise, personalized models sent back) makes
that level's ε infinite: refused unless `dp-uncovered = "allow"`.
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
INFINITE = "inf"  # summary.json's ε for a level some release is not covered at (JSON has no ∞)
NEIGHBOURS = ("replace-one: datasets differ in one example's values (statistics) or one "
              "client's data (rounds); who takes part and each client's row count are public")
NOISE_SOURCE = "the operating system's entropy, fresh for every release"
TRUST = {"central": "the server sees what the clients send exactly and adds the noise; the "
                    "guarantee covers what the run releases",
         "distributed": "each client holding data adds its share of the noise before SecAgg+ "
                        "masks its statistics: the server sees only their noisy sum"}


def _accountant(delta: float) -> RdpAccountant:
    """An RDP accountant for unsampled Gaussian releases. Flower's wrapper pairs "no
    amplification" with add-or-remove-one only; for an unsampled Gaussian the RDP curve is the
    same under either relation once σ is taken against that relation's sensitivity, which is
    what every σ here is (std / replace-one sensitivity)."""
    return RdpAccountant(PrivacyConfig(delta, 1, NeighboringRelation.ADD_OR_REMOVE_ONE,
                                       SamplingMethod.NO_AMPLIFICATION))


def epsilon_spent(noise_multiplier: float, releases: int, delta: float) -> float:
    """ε after `releases` Gaussian releases of noise multiplier σ (std / sensitivity), at δ."""
    return composed_epsilon([(noise_multiplier, releases)], delta)


def composed_epsilon(events: Sequence[tuple[float, int]], delta: float) -> float:
    """ε at δ of every (σ, releases) in `events` composed by one accountant."""
    accountant = _accountant(delta)
    for noise_multiplier, releases in events:
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


def _noise() -> np.random.Generator:
    """A generator seeded from the OS's entropy: no seed of the run's, so no one regenerates
    (and subtracts) the noise."""
    return np.random.default_rng()


def clip_rows(features: torch.Tensor, bound: float) -> torch.Tensor:
    """Each row scaled down to norm `bound` if above it: what one example adds is bounded."""
    norms = features.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return features * (bound / norms).clamp(max=1.0)


def gram_shift(std: float, size: int) -> float:
    """The spectral edge of a size x size symmetric Gaussian noise matrix of entry std `std`."""
    return 2.0 * std * math.sqrt(size)


def statistics_sensitivities(clip: float) -> tuple[float, float, float, float]:
    """What replacing one example (norm ≤ C) can change each block by, in L2: the counts (one
    class down, one up: √2), the class sums (x → x': 2C), the square norms (√2·C²) and the Gram
    matrix (‖xxᵀ − x'x'ᵀ‖_F ≤ √2·C²)."""
    return math.sqrt(2.0), 2.0 * clip, math.sqrt(2.0) * clip ** 2, math.sqrt(2.0) * clip ** 2


def statistics_noise_share(stats: ClassStatistics, noise_multiplier: float, clip: float,
                           shares: int = 1) -> ClassStatistics:
    """`stats` plus one of `shares` equal shares of the Gaussian mechanism's noise: the blocks
    scaled by their sensitivities form one vector whose L2 sensitivity is √blocks, and
    `shares` independent shares (std / √shares each) sum to one release's noise. One share
    is the central mechanism; under SecAgg+ every client holding data adds its own."""
    rng = _noise()
    blocks = 4 if stats.gram is not None else 3
    scale = noise_multiplier * math.sqrt(blocks) / math.sqrt(shares)
    counts_s, sums_s, norms_s, gram_s = statistics_sensitivities(clip)
    counts = stats.counts + rng.normal(0.0, scale * counts_s, stats.counts.shape)
    sums = stats.sums + rng.normal(0.0, scale * sums_s, stats.sums.shape)
    square_norms = stats.square_norms + rng.normal(0.0, scale * norms_s, stats.counts.shape)
    gram = None
    if stats.gram is not None:
        d = len(stats.gram)
        upper = np.zeros((d, d))
        upper[np.triu_indices(d)] = rng.normal(0.0, scale * gram_s, d * (d + 1) // 2)
        gram = stats.gram + upper + np.triu(upper, 1).T
    return ClassStatistics(counts, sums, square_norms, gram)


def postprocessed(noisy: ClassStatistics, noise_multiplier: float, clip: float) -> ClassStatistics:
    """The noisy sums made usable, free of privacy (post-processing): symmetric noise of std s
    has eigenvalues down to about -2·s·√D (the semicircle's edge), which would leave the ridge
    system indefinite, so the Gram matrix's diagonal is raised by that much (a ridge penalty);
    a count or a square norm below zero is no one's."""
    gram = noisy.gram
    if gram is not None:
        std = noise_multiplier * math.sqrt(4) * statistics_sensitivities(clip)[3]
        gram = gram + gram_shift(std, len(gram)) * np.eye(len(gram))
    return ClassStatistics(np.maximum(noisy.counts, 0.0), noisy.sums,
                           np.maximum(noisy.square_norms, 0.0), gram)


def private_statistics(stats: ClassStatistics, noise_multiplier: float,
                       clip: float) -> ClassStatistics:
    """Central DP: the summed statistics with one release's noise, post-processed."""
    return postprocessed(statistics_noise_share(stats, noise_multiplier, clip), noise_multiplier,
                         clip)


@dataclasses.dataclass(frozen=True)
class PrivateRounds:
    """Client-level DP for one round: clipped updates, their unweighted mean over the clients
    sampled, Gaussian noise. Called where `RobustAggregation` is: returns the new heads and
    the replies the control variates may learn from (none: DP rounds run without SCAFFOLD)."""

    noise_multiplier: float
    clip: float
    private = True  # the strategy records no client metric (their train loss) beside the round

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
        # replacing one client's data moves its clipped update by up to 2·clip
        std = compute_stdv(self.noise_multiplier, 2.0 * self.clip, denominator)
        rng = _noise()
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
    return PrivateRounds(rounds_noise(config), config.dp_clip)


def _epsilon(value: float, covered: bool) -> float | str:
    return value if covered else INFINITE


def privacy_report(config: RunConfig) -> dict:
    """What `summary.json` says of the privacy spent: per mechanism, its σ, clip, releases and
    the ε it alone spends; for the run, one accountant's ε at each level (example, client),
    "inf" where a release is not covered, and the releases that are not."""
    mechanisms: dict[str, dict] = {}
    events: list[tuple[float, int]] = []
    releases = config.data_releases
    if "statistics" in releases and config.dp_statistics_epsilon > 0:
        sigma = statistics_noise(config)
        events.append((sigma, 1))
        mechanisms["statistics"] = {"level": "example", "noise_multiplier": sigma,
                                    "clip": config.dp_feature_clip, "releases": 1,
                                    "trust": "distributed" if config.statistics_aggregation
                                    == "secagg+" else "central"}
    if "rounds" in releases and config.dp_rounds_epsilon > 0:
        sigma, count = rounds_noise(config), max(config.num_server_rounds, 1)
        events.append((sigma, count))
        mechanisms["rounds"] = {"level": "client", "noise_multiplier": sigma,
                                "clip": config.dp_clip, "releases": count, "trust": "central"}
    for mechanism in mechanisms.values():
        mechanism["epsilon"] = epsilon_spent(mechanism["noise_multiplier"], mechanism["releases"],
                                             config.dp_delta)
        mechanism["delta"] = config.dp_delta
    uncovered = [name for name in releases if name not in mechanisms]
    client_events = [(m["noise_multiplier"], m["releases"]) for m in mechanisms.values()
                     if m["level"] == "client"]
    example = composed_epsilon(events, config.dp_delta) if events else 0.0
    client = composed_epsilon(client_events, config.dp_delta) if client_events else 0.0
    return {**mechanisms,
            "run": {"example_epsilon": _epsilon(example, not uncovered),
                    "client_epsilon": _epsilon(client, not uncovered and "statistics" not in mechanisms),
                    "delta": config.dp_delta, "uncovered": uncovered,
                    "amplification_by_sampling": False},
            "neighbouring": NEIGHBOURS, "noise": NOISE_SOURCE,
            "trust": {m["trust"]: TRUST[m["trust"]] for m in mechanisms.values()}}
