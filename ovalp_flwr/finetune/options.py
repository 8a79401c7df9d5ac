"""The encoder path's knobs (run config): which method trains through the encoder, and LoRA's
shape. Torch-free (this package's __init__ imports nothing)."""

from __future__ import annotations

from dataclasses import dataclass

from ovalp_flwr.options import ConfigError, Options, Whole, at_least, key, one_of, positive

FINETUNES = ("none", "lp", "fedavg-lora", "flora", "full")  # methods.py


@dataclass(frozen=True)
class FinetuneOptions(Options):
    """Training through the encoder on raw data instead of heads on cached features."""

    TITLE = "Fine-tuning the encoder"
    INTRO = ("Training through the encoder on raw data instead of heads on cached features "
             "([Fine-tuning the encoder](finetune.md)).")

    finetune: str = key(
        "none", "`none`: heads on the cache (OvA-LP); `lp`: heads through the "
        "frozen encoder; `fedavg-lora`: LoRA's A and B averaged apart; `flora`: LoRA modules "
        "stacked; `full`: the whole encoder.", FINETUNES)
    lora_rank: int = key(
        8, "LoRA's rank, for `fedavg-lora` and `flora`.")
    lora_alpha: float = key(
        16.0, "LoRA's alpha (the update is B A × alpha / rank), for `fedavg-lora` "
        "and `flora`.")

    def check(self) -> None:
        one_of("finetune", self.finetune, FINETUNES)
        at_least("lora-rank", self.lora_rank, 1)
        positive("lora-alpha", self.lora_alpha)

    def requires(self, config: Whole) -> None:
        """The encoder path's limits: no closed-form start (no cached statistics), no adapter,
        no feature-skew partition, no SCAFFOLD under FLoRA (its LoRA restarts every round)."""
        if self.finetune == "none":
            return
        if config.head_init not in ("random", "zeros"):
            raise ConfigError("head-init", config.head_init, f"finetune={self.finetune!r} trains "
                              "on raw data, without the cached statistics a closed-form start "
                              "needs; use random or zeros")
        if config.adapter_dim:
            raise ConfigError("adapter-dim", config.adapter_dim, f"finetune={self.finetune!r} "
                              "trains the encoder itself; use 0")
        if "feature-skew" in (config.partition, config.within_domain):
            raise ConfigError("partition", config.partition, "feature-skew partitions by cached "
                              "features; with finetune use another partition")
        if self.finetune == "flora" and config.drift_correction != "none":
            raise ConfigError("drift-correction", config.drift_correction, "FLoRA starts fresh "
                              "LoRA modules every round, so there is no drift to correct; use none")
        not_yet = {"server-optimizer": (config.server_optimizer, "fedavg", "fedavg"),
                   "fraction-evaluate": (config.fraction_evaluate, 0.0, "0 (the server evaluates)"),
                   "resume": (config.resume if self.finetune == "flora" else False, False,
                              "false (FLoRA's nodes hold the stacks they merged: its runs write "
                              "no checkpoint)"),
                   "personalize": (config.personalize if self.finetune == "flora" else "", "",
                                   '"" (FLoRA\'s nodes lack the last round\'s stack; '
                                   'personalize after lp, fedavg-lora or full)')}
        for name, (value, allowed, say) in not_yet.items():
            if value != allowed:
                raise ConfigError(name, value, f"with finetune={self.finetune!r} use {say}")
