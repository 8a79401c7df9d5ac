"""Linear probing through the encoder: the heads train on the frozen encoder's features, as on
the cached path, but computed every step (the baseline a cache makes cheap)."""

from ovalp_flwr.finetune.base import FinetuneMethod


class LinearProbing(FinetuneMethod):
    name = "lp"
