"""Differential privacy for what clients send: the statistics of the closed-form start and the
heads' rounds, each a Gaussian mechanism, composed by one RDP accountant per run (Google's
`dp-accounting`, which Flower's `RdpAccountant` wraps) into the (ε, δ) the run spends.

The trust model is central DP, but for the statistics under SecAgg+: the server is trusted with
what clients send (their statistics, their updates, their sample counts); what is protected is
everything the run *releases* (the model, summary.json, rounds.csv). With
`statistics-aggregation = "secagg+"` the statistics' noise is distributed: each client holding
data adds 1/m of its variance (m: the clients holding data) before SecAgg+ masks its vector,
and the server, which sees only the sum, sees it noisy. SecAgg+ here refuses a sum that misses
any client, so the shares never add up to less than one release's noise. Who takes part
and how many rows each holds are public (the server plans with the counts `describe` gives), so
neighbouring datasets differ in the *value* of one record, not its presence: replace-one, of an
example for the statistics and of a client's whole data for the rounds. The noise comes from
the operating system's entropy, fresh for every release: nothing a client or summary.json sees
(the run's seed included) can regenerate it.

- **Statistics** (`dp-statistics-epsilon`, example-level): each client clips every feature
  vector to norm `dp-feature-clip` (C) before it sums; Gaussian noise goes on the summed
  counts, class sums, square norms and Gram matrix, each block scaled by what replacing one
  example can change it by (√2, 2C, √2·C², √2·C²). One release.
- **Rounds** (`dp-rounds-epsilon`, client-level, Flower's
  `DifferentialPrivacyServerSideFixedClipping` under replace-one): each client's update is
  clipped to `dp-clip` with Flower's `compute_clip_model_update`, the clipped updates are
  averaged unweighted over the clients sampled, and Gaussian noise of std σ·2·clip/sampled
  (Flower's `compute_stdv` at the replace-one sensitivity 2·clip) is added. One release per
  round. With `fraction-train` < 1 the strategy samples a fixed number of clients without
  replacement, drawn from OS entropy (a sample the seed fixed would be public), and the
  accountant takes the amplification by that sampling (Wang-Balle-Kasiviswanathan 2019).
  With `robust-aggregation`, the rule combines the clipped updates inside this wrapper, and
  the noise is sized for the clip ball's diameter (2·clip) instead of the mean's 2·clip / n.
  Each round's record keeps the noise as drawn; the report composes those (`applied_rounds`).

Each mechanism's noise multiplier σ is calibrated so that it alone spends the ε asked for at
`dp-delta`; the run's accountant composes them. A client-level guarantee covers any one example
too, so the example-level ε composes every release; the client-level ε only the rounds (the
statistics' noise covers one example, not a client's data). A release of client data without
noise (a start from exact statistics, rounds without noise, personalized models sent back) makes
that level's ε infinite: refused unless `dp-uncovered = "allow"`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.supercore.differential_privacy import compute_clip_model_update, compute_stdv

from ovalp_flwr.federation.options import RoundOptions
from ovalp_flwr.privacy.options import PrivacyOptions
from ovalp_flwr.core.head_init.statistics import ClassStatistics
from ovalp_flwr.federation.replies import TrainReply
from ovalp_flwr.federation.costs import sample_size

if TYPE_CHECKING:
    from dp_accounting import dp_event

Arrays = dict[str, np.ndarray]
INFINITE = "inf"  # summary.json's ε for a level some release is not covered at (JSON has no ∞)
NEIGHBOURS = ("replace-one: datasets differ in one example's values (statistics) or one "
              "client's data (rounds); who takes part and each client's row count are public")
NOISE_SOURCE = "the operating system's entropy, fresh for every release"
TRUST = {"central": "the server sees what the clients send exactly and adds the noise; the "
                    "guarantee covers what the run releases",
         "distributed": "each client holding data adds its share of the noise before SecAgg+ "
                        "masks its statistics: the server sees only their noisy sum"}


@dataclasses.dataclass(frozen=True)
class Releases:
    """`count` Gaussian releases of noise multiplier σ (std / replace-one sensitivity), each
    over a uniform sample of `sample` of the `population` records drawn without replacement
    (every record when sample = population: no amplification)."""

    noise_multiplier: float
    count: int = 1
    sample: int = 1
    population: int = 1

    def event(self) -> dp_event.DpEvent:
        from dp_accounting import dp_event  # late: as composed_epsilon

        gaussian = dp_event.GaussianDpEvent(self.noise_multiplier)
        if self.sample >= self.population:
            return gaussian
        return dp_event.SampledWithoutReplacementDpEvent(self.population, self.sample, gaussian)


def composed_epsilon(releases: Sequence[Releases], delta: float) -> float:
    """ε at δ of every release composed by one RDP accountant, under replace-one (the
    relation Wang-Balle-Kasiviswanathan's fixed-size sampling analysis needs). Google's
    dp-accounting (what Flower's RdpAccountant wraps; flwr[dp] installs it), used directly:
    one accountant composes unsampled and subsampled releases."""
    # late: dp-accounting pulls in scipy (1.5-2 s of CPU), and every app process imports this
    # module (the clients clip their rows): only a private run pays for its accountant
    from dp_accounting.privacy_accountant import NeighboringRelation  # late: see above
    from dp_accounting.rdp import RdpAccountant  # late: see above

    accountant = RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    for release in releases:
        accountant.compose(release.event(), release.count)
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=256)  # a subsampled curve costs ~0.5 s: each is computed once
def epsilon_spent(noise_multiplier: float, releases: int, delta: float, sample: int = 1,
                  population: int = 1) -> float:
    """ε after `releases` Gaussian releases of noise multiplier σ (std / sensitivity), at δ,
    each over `sample` of `population` (sampled without replacement)."""
    return composed_epsilon([Releases(noise_multiplier, releases, sample, population)], delta)


@functools.lru_cache(maxsize=64)
def noise_multiplier_for(epsilon: float, releases: int, delta: float, sample: int = 1,
                         population: int = 1) -> float:
    """The smallest σ ≥ 0.01 (to a relative 1e-4) whose `releases` spend at most ε at δ."""
    def spent(sigma: float) -> float:
        return epsilon_spent(sigma, releases, delta, sample, population)

    low, high = 1e-2, 1.0
    while spent(high) > epsilon:
        low, high = high, high * 2
    while high / low > 1 + 1e-4:
        middle = math.sqrt(low * high)
        if spent(middle) > epsilon:
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


def released_arrays(stats: ClassStatistics) -> dict[str, np.ndarray]:
    """The statistics as released (noisy, post-processed), in float64, for the checkpoint: a
    resumed run reuses them instead of asking the clients again (a second noisy draw that no
    accountant counts, which a server could average with the first)."""
    arrays = {"counts": stats.counts, "sums": stats.sums, "square-norms": stats.square_norms}
    if stats.gram is not None:
        arrays["gram-triu"] = stats.gram[np.triu_indices(len(stats.gram))]
    return {key: np.asarray(value, np.float64) for key, value in arrays.items()}


def released_statistics(arrays: dict[str, np.ndarray]) -> ClassStatistics:
    """Back from `released_arrays`, bit for bit."""
    gram = None
    if "gram-triu" in arrays:
        d = arrays["sums"].shape[1]
        gram = np.zeros((d, d))
        gram[np.triu_indices(d)] = arrays["gram-triu"]
        gram = gram + np.triu(gram, 1).T
    return ClassStatistics(arrays["counts"], arrays["sums"], arrays["square-norms"], gram)


@dataclasses.dataclass
class PrivateRounds:
    """Client-level DP for one round: clipped updates, their unweighted mean over the clients
    sampled, Gaussian noise: the round's combination in place of the mean (the strategy's
    `privacy`), before the server's step. Returns the new heads and the replies the control
    variates may learn from (none: DP rounds run without SCAFFOLD). `applied`: the noise of the
    last call, as it was drawn (the round's record keeps it; the accountant reads those)."""

    noise_multiplier: float
    clip: float
    applied: dict = dataclasses.field(default_factory=dict)
    # a robust rule inside the clipping (Flower's DP wraps any strategy so): it combines the
    # clipped updates, its result is projected into the clip ball, and the noise is sized for
    # that ball's diameter, 2·clip (what replacing one client can move any rule's output by,
    # once projected), not the mean's 2·clip / n
    inner: Callable[..., tuple[Arrays, list[TrainReply]]] | None = None

    def __call__(self, replies: Sequence[TrainReply], global_arrays: Arrays,
                 server_round: int = 0, sampled: int = 0) -> tuple[Arrays, list[TrainReply]]:
        keys = sorted(global_arrays)
        denominator = max(sampled, len(replies))  # a client without data adds a zero update
        base = [global_arrays[key].astype(np.float64) for key in keys]
        total = [np.zeros_like(b) for b in base]
        clipped = []  # the clipped replies, kept only for a robust rule
        for reply in replies:
            update = [reply.arrays[key].astype(np.float64) for key in keys]
            if any(np.any(u != b) for u, b in zip(update, base)):  # Flower's divides by the norm
                compute_clip_model_update(update, base, self.clip)  # update := base + clipped delta
            if self.inner is None:
                for index, (u, b) in enumerate(zip(update, base)):
                    total[index] += u - b
            else:  # every client weighted alike: DP rounds are unweighted
                clipped.append(dataclasses.replace(reply, weight=1.0,
                                                   arrays=dict(zip(keys, update))))
        if self.inner is None:  # the unweighted mean: replacing one client moves it 2·clip / n
            center = [summed / denominator for summed in total]
            std = compute_stdv(self.noise_multiplier, 2.0 * self.clip, denominator)
        else:
            center = self._robust_center(clipped, base, keys, global_arrays, server_round,
                                         sampled)
            std = compute_stdv(self.noise_multiplier, 2.0 * self.clip, 1)
        self.applied = {"dp_noise_multiplier": self.noise_multiplier, "dp_noise_std": std,
                        "dp_clients_in_mean": denominator}
        rng = _noise()
        heads = {key: (global_arrays[key] + delta + rng.normal(0.0, std, delta.shape)
                       ).astype(global_arrays[key].dtype) for key, delta in zip(keys, center)}
        return heads, []

    def _robust_center(self, clipped: list[TrainReply], base: list[np.ndarray], keys: list[str],
                       global_arrays: Arrays, server_round: int,
                       sampled: int) -> list[np.ndarray]:
        """The robust rule's update from the clipped replies, projected into the clip ball."""
        combined, _ = self.inner(clipped, global_arrays, server_round, sampled)
        center = [combined[key].astype(np.float64) - b for key, b in zip(keys, base)]
        norm = math.sqrt(sum(float(np.square(c).sum()) for c in center))
        scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
        return [c * scale for c in center]


def statistics_noise(dp: PrivacyOptions) -> float:
    """σ for the start's statistics: one release spending `dp-statistics-epsilon`."""
    return noise_multiplier_for(dp.dp_statistics_epsilon, 1, dp.dp_delta)


def rounds_releases(dp: PrivacyOptions, rounds: RoundOptions, population: int) -> Releases:
    """The rounds as the accountant sees them: `num-server-rounds` releases, each over the
    clients the strategy samples (`fraction-train` of the `population` nodes, a fixed number
    drawn without replacement from OS entropy: amplification by sampling), at the σ that
    spends `dp-rounds-epsilon` together."""
    count, sample = max(rounds.num_server_rounds, 1), sample_size(population, rounds.fraction_train)
    sigma = noise_multiplier_for(dp.dp_rounds_epsilon, count, dp.dp_delta, sample, population)
    return Releases(sigma, count, sample, population)


def private_rounds(dp: PrivacyOptions, rounds: RoundOptions, population: int = 1,
                   inner: Callable | None = None) -> PrivateRounds | None:
    """The run's DP aggregation of the rounds over `population` nodes (with `inner`, a robust
    rule inside its clipping), or None when they are not private."""
    if dp.dp_rounds_epsilon <= 0:
        return None
    return PrivateRounds(rounds_releases(dp, rounds, population).noise_multiplier, dp.dp_clip,
                         inner=inner)


def _epsilon(value: float, covered: bool) -> float | str:
    return value if covered else INFINITE


def applied_rounds(records: dict[int, dict]) -> list[Releases]:
    """The rounds' releases as they were drawn: each round's σ, the clients sampled and the
    nodes they were drawn from, from the round records the strategy kept (and checkpointed)."""
    return [Releases(float(r["dp_noise_multiplier"]), 1, int(r["clients_sampled"]),
                     int(r["dp_population"]))
            for _, r in sorted(records.items()) if "dp_noise_multiplier" in r]


def _grouped(releases: Sequence[Releases]) -> list[Releases]:
    """Equal releases as one with their count: the accountant composes a subsampled event's
    curve once per distinct event (~0.5 s each), not once per round."""
    counts: dict[Releases, int] = {}
    for release in releases:
        single = dataclasses.replace(release, count=1)
        counts[single] = counts.get(single, 0) + release.count
    return [dataclasses.replace(release, count=count) for release, count in counts.items()]


def _one_or_all(values: Sequence) -> object:
    """One value where every release had it, else each distinct one (summary.json)."""
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else distinct


def privacy_report(dp: PrivacyOptions, rounds: RoundOptions, made: Sequence[str],
                   secure_sum: bool, population: int = 1,
                   applied: list[Releases] | None = None) -> dict:
    """What `summary.json` says of the privacy spent: per mechanism, its σ, clip, releases and
    the ε it alone spends; for the run, one accountant's ε at each level (example, client),
    "inf" where a release is not covered, and the releases that are not. `made`: the run's
    data releases (the config's `data_releases`); `secure_sum`: the statistics summed under
    SecAgg+; `applied`: the rounds' releases as drawn (`applied_rounds`), which the accountant
    composes in place of the plan when given, so the ε reported is the ε spent, checked against
    the ε asked."""
    mechanisms: dict[str, dict] = {}
    releases: dict[str, list[Releases]] = {}
    if "statistics" in made and dp.dp_statistics_epsilon > 0:
        releases["statistics"] = [Releases(statistics_noise(dp))]
        mechanisms["statistics"] = {"level": "example", "clip": dp.dp_feature_clip,
                                    "trust": "distributed" if secure_sum else "central"}
    if "rounds" in made and dp.dp_rounds_epsilon > 0:
        drawn = _grouped(applied) if applied is not None else \
            [rounds_releases(dp, rounds, population)]
        releases["rounds"] = drawn
        mechanisms["rounds"] = {"level": "client", "clip": dp.dp_clip, "trust": "central",
                                "sampled": _one_or_all([r.sample for r in drawn] or [0]),
                                "population": _one_or_all([r.population for r in drawn]
                                                          or [population]),
                                "as_drawn": applied is not None}
    for name, mechanism in mechanisms.items():
        release = releases[name]
        mechanism.update(noise_multiplier=_one_or_all([r.noise_multiplier for r in release]
                                                      or [0.0]),
                         releases=sum(r.count for r in release),
                         epsilon=composed_epsilon(release, dp.dp_delta) if release else 0.0,
                         delta=dp.dp_delta)
        mechanism["within_asked"] = mechanism["epsilon"] <= dp.epsilon(
            f"dp-{name}-epsilon") * (1 + 1e-3)
    uncovered = [name for name in made if name not in mechanisms]
    by_client = [r for name, rs in releases.items() if mechanisms[name]["level"] == "client"
                 for r in rs]
    every = [r for rs in releases.values() for r in rs]
    example = composed_epsilon(every, dp.dp_delta) if every else 0.0
    client = composed_epsilon(by_client, dp.dp_delta) if by_client else 0.0
    amplified = any(r.sample < r.population for r in every)
    return {**mechanisms,
            "run": {"example_epsilon": _epsilon(example, not uncovered),
                    "client_epsilon": _epsilon(client, not uncovered and "statistics" not in mechanisms),
                    "delta": dp.dp_delta, "uncovered": uncovered,
                    "amplification_by_sampling": amplified},
            "neighbouring": NEIGHBOURS, "noise": NOISE_SOURCE,
            "trust": {m["trust"]: TRUST[m["trust"]] for m in mechanisms.values()}}


def uncovered_fields(summary: dict) -> list[str]:
    """What summary.json (and the log line and MLflow parameters made from the same values)
    carries that no noise covers, beside the ε: each client's classes and domains (computed
    from labels), the nodes a round refused (they tell who was sampled, which weakens the
    amplification) and label noise's realised rate."""
    fields = []
    partition = summary.get("partition", {})
    if any(partition.get("classes", [])) or any(partition.get("domains", [])):
        fields.append("partition.classes, partition.domains: each client's classes and "
                      "domains, from its labels")
    if any(r.get("rejections") for r in summary.get("rounds", [])):
        fields.append("rounds[].rejections: the nodes refused, so sampled, in each round")
    if summary.get("label_noise", {}).get("kind", "none") != "none":
        fields.append("label_noise.realised_rate: from the clients' flipped labels")
    return fields
