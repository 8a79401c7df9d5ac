"""`label-flip`: it trains honestly on its own features with every label moved one class on (a
fixed permutation of the classes); its replies are what that training gives."""

from __future__ import annotations

from ovalp_flwr.federation.adversary.base import Attack


class LabelFlip(Attack):
    name = "label-flip"
    trains_on_lies = True

    def labels(self, labels, num_classes):
        return (labels + 1) % num_classes
