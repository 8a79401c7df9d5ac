"""Differential privacy's knobs (run config): the ε each release spends, the clipping bounds,
δ, and what a private run may still release without noise. Torch- and Flower-free."""

from __future__ import annotations

from dataclasses import dataclass

from ovalp_flwr.options import ConfigError, Options, Whole, key, one_of, positive, share

DP_UNCOVERED = ("refuse", "allow")  # a private run's releases without noise: federation.privacy
EPSILONS = {"dp-statistics-epsilon": "statistics", "dp-rounds-epsilon": "rounds"}  # key: release


@dataclass(frozen=True)
class PrivacyOptions(Options):
    """Differential privacy for the start's statistics and for the rounds."""

    TITLE = "Differential privacy"
    INTRO = ("Example-level DP for the start's statistics and client-level DP for the rounds, "
             "with one accountant ([Robustness](robustness.md#differential-privacy)).")

    dp_statistics_epsilon: float = key(
        0.0, "Example-level differential privacy for the start's statistics: the ε "
        "they spend at `dp-delta` (`0`: off). Each client clips every feature vector to "
        "`dp-feature-clip`; the server adds Gaussian noise calibrated to this ε to the summed "
        "counts, class sums, square norms and Gram matrix. Needs a `feature-norm` that reads no "
        "client data ([Robustness](robustness.md)).")
    dp_feature_clip: float = key(
        1.0, "With `dp-statistics-epsilon`: the norm every feature vector is clipped "
        "to (`feature-norm = \"l2\"` makes it 1).")
    dp_rounds_epsilon: float = key(
        0.0, "Client-level differential privacy for the heads' rounds: the ε the whole "
        "run spends at `dp-delta` (`0`: off). Each update is clipped to `dp-clip`, the clipped "
        "updates are averaged over the clients sampled, and Gaussian noise calibrated to this ε "
        "is added (Flower's server-side fixed clipping). Needs `drift-correction = \"none\"` "
        "and a `feature-norm` that reads no client data ([Robustness](robustness.md)).")
    dp_clip: float = key(
        0.05, "With `dp-rounds-epsilon`: the norm each client's update is clipped to.")
    dp_delta: float = key(
        1e-5, "The δ at which `dp-statistics-epsilon` and `dp-rounds-epsilon` are "
        "spent, in (0, 1).")
    dp_uncovered: str = key(
        "refuse", "A private run that also releases client data without noise (a "
        "start from exact statistics under DP rounds, rounds without noise after a DP start, "
        "personalized models, client-side evaluation or validation scores): `refuse` it, or "
        "`allow` it, and summary.json then gives ε = \"inf\" at every level that release "
        "breaks ([Robustness](robustness.md#differential-privacy)).", DP_UNCOVERED)

    def epsilon(self, name: str) -> float:
        """The ε of `dp-statistics-epsilon` or `dp-rounds-epsilon`."""
        return getattr(self, name.replace("-", "_"))

    def check(self) -> None:
        for name in EPSILONS:
            if self.epsilon(name) < 0:
                raise ConfigError(name, self.epsilon(name), "use an ε > 0, or 0 for no "
                                  "differential privacy")
        one_of("dp-uncovered", self.dp_uncovered, DP_UNCOVERED)
        positive("dp-clip", self.dp_clip)
        positive("dp-feature-clip", self.dp_feature_clip)
        share("dp-delta", self.dp_delta, 0, 1, low_open=True, high_open=True, what="a δ")

    def requires(self, config: Whole) -> None:
        """What a private run cannot use: anything that shows the server (or the model) client
        data the noise does not cover."""
        private = [name for name in EPSILONS if self.epsilon(name) > 0]
        if not private:
            return
        if config.finetune != "none":
            raise ConfigError(private[0], self.epsilon(private[0]), "differential privacy runs "
                              'on the cached-feature path (finetune="none")')
        if config.feature_norm not in ("none", "l2"):
            raise ConfigError("feature-norm", config.feature_norm, f"with {private[0]} use "
                              '"l2" or "none": the others normalise by the clients\' summed '
                              "moments, which no noise covers")
        if self.dp_statistics_epsilon > 0 and config.robust_start != "none":
            raise ConfigError("robust-start", config.robust_start, "with dp-statistics-epsilon "
                              'use "none": the check reads each client\'s statistics, which no '
                              "noise covers")
        if self.dp_rounds_epsilon > 0:
            for name, allowed in (("drift-correction", "none"), ("server-optimizer", "fedavg")):
                value = getattr(config, name.replace("-", "_"))
                if value != allowed:
                    raise ConfigError(name, value, f'with dp-rounds-epsilon use "{allowed}": DP '
                                      "rounds average clipped updates, with noise, and nothing "
                                      "else reads them")
        self._check_releases(config)

    def _check_releases(self, config: Whole) -> None:
        """Each ε protects a release the run makes, and (unless `dp-uncovered = "allow"`)
        nothing else leaves the clients without noise: the key that makes each release."""
        releases = config.data_releases
        for name, release in EPSILONS.items():
            if self.epsilon(name) > 0 and release not in releases:
                raise ConfigError(name, self.epsilon(name), f"this run sends no {release} to "
                                  "protect (head-init, num-server-rounds); use 0")
        if self.dp_uncovered == "allow":
            return
        covered = {release: self.epsilon(name) > 0 for name, release in EPSILONS.items()}
        makers = {"statistics": ("head-init", 'a start that reads none ("zeros", "random"), or '
                                 "dp-statistics-epsilon too"),
                  "rounds": ("num-server-rounds", "0, or dp-rounds-epsilon too"),
                  "validation": ("validation-rows", '"server"'),
                  "evaluation": ("fraction-evaluate", "0"),
                  "personalization": ("personalize", '""')}
        for release in releases:
            if not covered.get(release, False):
                name, allowed = makers[release]
                raise ConfigError(name, getattr(config, name.replace("-", "_")), f"a private "
                                  f"run sends its {release} without noise here; use {allowed}, "
                                  'or dp-uncovered="allow" (summary.json then says ε = inf '
                                  "where it breaks the guarantee)")
