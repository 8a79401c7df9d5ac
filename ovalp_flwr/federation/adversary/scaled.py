"""`scale-10`, `scale-100`: its update (its model minus the global one sent) times 10 or 100;
`sign-flip`: minus its update. Under `server-optimizer = "lbfgs"` a reply is a gradient: it is
scaled itself."""

from __future__ import annotations

from ovalp_flwr.federation.adversary.base import Attack


class Scaled(Attack):
    factor = 1.0
    updates_only = True

    def update(self, arrays, sent, gradient):
        if gradient:
            return {key: (self.factor * value).astype(value.dtype) for key, value in arrays.items()}
        return {key: (sent[key] + self.factor * (value - sent[key])).astype(value.dtype)
                for key, value in arrays.items()}


class ScaleTen(Scaled):
    name, factor = "scale-10", 10.0


class ScaleHundred(Scaled):
    name, factor = "scale-100", 100.0


class SignFlip(Scaled):
    name, factor = "sign-flip", -1.0
