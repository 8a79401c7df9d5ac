"""The sufficient statistics of a linear probe on frozen features, gathered the federated way.

With frozen features every closed-form start is a function of sums over samples: per-class
counts n_c, per-class feature sums S = YᵀX and (for ridge) the Gram matrix G = XᵀX. A client
sends the sums over its own rows; the server adds them up, so the federation's statistics
are the centralised ones on any partition (up to the float32 rounding of each client's sums
on the wire). What a client reveals by them is stated in the README ("Closed-form starts").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

# what a start asks the clients for; "none": no statistics (random or zero heads); "low-rank":
# the class sums and the top directions of the client's within-class scatter (`gram_estimate`)
KINDS = ("none", "class-sums", "gram", "low-rank")
WIRE_DTYPE = np.float32


@dataclass(frozen=True)
class ClientSums:
    """Each client's own per-class counts and feature sums, a row per (client, class it holds):
    how far the clients' class means spread, which FedCOF reads the class covariances from.
    The server keeps them as the plain replies come (`federation.setup.StatisticsSum`)."""

    labels: np.ndarray  # int64 [P]: the class of each row
    counts: np.ndarray  # float64 [P]: that client's samples of it (> 0)
    sums: np.ndarray  # float64 [P, D]: their feature sum

    @staticmethod
    def of_rows(rows: list[tuple[int, float, np.ndarray]], num_features: int) -> "ClientSums":
        """From (class, count, sum) rows (`class_rows`)."""
        return ClientSums(np.array([c for c, _, _ in rows], np.int64),
                          np.array([n for _, n, _ in rows], np.float64),
                          np.array([s for _, _, s in rows], np.float64).reshape(len(rows),
                                                                                num_features))

    @staticmethod
    def of_clients(parts: list["ClassStatistics"]) -> "ClientSums":
        """The rows of clients' statistics: each client's classes it holds."""
        return ClientSums.of_rows([row for part in parts for row in class_rows(part.counts, part.sums)],
                                  parts[0].sums.shape[1])


def class_rows(counts: np.ndarray, sums: np.ndarray) -> list[tuple[int, float, np.ndarray]]:
    """One client's (class, count, feature sum) for each class it holds, in float64."""
    return [(int(c), float(counts[c]), np.asarray(sums[c], np.float64))
            for c in np.flatnonzero(counts > 0)]


@dataclass(frozen=True)
class ClassStatistics:
    """Per-class counts and feature sums, and optionally the Gram matrix, of some rows."""

    counts: np.ndarray  # float64 [K]
    sums: np.ndarray  # float64 [K, D]: row c is the sum of class c's features
    square_norms: np.ndarray  # float64 [K]: sum of ||x||² over class c's rows
    gram: np.ndarray | None = None  # float64 [D, D], symmetric: XᵀX
    clients: ClientSums | None = None  # each client's own class sums, where the server kept them
    scatter_factor: np.ndarray | None = None  # float64 [r, D]: one client's top scatter (low-rank)

    @classmethod
    def of(cls, features: torch.Tensor, labels: torch.Tensor, num_classes: int,
           with_gram: bool, rank: int | None = None) -> "ClassStatistics":
        """A client's sums, computed where its rows live (the GPU when there is one); with
        `rank`, the factor of its within-class scatter's top `rank` directions instead of the
        Gram matrix (`scatter_factor`)."""
        onehot = torch.nn.functional.one_hot(labels.long(), num_classes).to(features.dtype)
        gram = features.T @ features if with_gram else None
        sums = onehot.T @ features
        factor = None if rank is None else scatter_factor(features, onehot, sums, rank)
        return cls(_float64(onehot.sum(0)), _float64(sums),
                   _float64(onehot.T @ features.square().sum(1)),
                   None if gram is None else _float64(gram), scatter_factor=factor)

    @property
    def num_classes(self) -> int:
        return len(self.counts)

    @property
    def num_samples(self) -> int:
        return int(round(self.counts.sum()))

    @property
    def total(self) -> np.ndarray:
        """The sum of all rows (every row has one label)."""
        return self.sums.sum(axis=0)

    @property
    def class_means(self) -> np.ndarray:
        """[K, D]; zero for a class nobody holds."""
        return self.sums / np.maximum(self.counts, 1.0)[:, None]

    @staticmethod
    def merge(parts: list["ClassStatistics"]) -> "ClassStatistics":
        """The federation's statistics: plain sums, in float64."""
        if not parts:
            raise ValueError("no client sent statistics for the head's start")
        grams = [p.gram for p in parts]
        if any(g is None for g in grams) and not all(g is None for g in grams):
            raise ValueError("some clients sent a Gram matrix and others did not")
        return ClassStatistics(
            np.sum([p.counts for p in parts], axis=0),
            np.sum([p.sums for p in parts], axis=0),
            np.sum([p.square_norms for p in parts], axis=0),
            None if grams[0] is None else np.sum(grams, axis=0),
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The wire form: float32, and the Gram matrix as its upper triangle (half the bytes)."""
        arrays = {"counts": self.counts.astype(WIRE_DTYPE), "sums": self.sums.astype(WIRE_DTYPE),
                  "square-norms": self.square_norms.astype(WIRE_DTYPE)}
        if self.gram is not None:
            arrays["gram-triu"] = self.gram[upper_mask(len(self.gram))].astype(WIRE_DTYPE)
        if self.scatter_factor is not None:
            arrays["scatter-factor"] = self.scatter_factor.astype(WIRE_DTYPE)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "ClassStatistics":
        """Back from the wire form; the shapes must agree with each other."""
        counts, sums, square_norms = (np.asarray(arrays[key], np.float64)
                                      for key in ("counts", "sums", "square-norms"))
        if sums.ndim != 2 or counts.shape != (len(sums),) or square_norms.shape != counts.shape:
            raise ValueError(f"statistics have counts {counts.shape}, sums {sums.shape} and square "
                             f"norms {square_norms.shape}; expected [K], [K, D] and [K]")
        gram = None
        if "gram-triu" in arrays:
            gram = unpack_symmetric(np.asarray(arrays["gram-triu"], np.float64), sums.shape[1])
        factor = None
        if "scatter-factor" in arrays:
            factor = np.asarray(arrays["scatter-factor"], np.float64)
            if factor.ndim != 2 or factor.shape[1] != sums.shape[1]:
                raise ValueError(f"a scatter factor has shape {factor.shape}; expected [r, "
                                 f"{sums.shape[1]}]")
        return cls(counts, sums, square_norms, gram, scatter_factor=factor)

    def gram_estimate(self) -> np.ndarray:
        """One client's Gram matrix from its low-rank statistics: exact where they reach.
            G ≈ Σ_c S_c S_cᵀ / n_c + FᵀF + ρ / (D − r) · (I − VᵀV)
        the between-class part from the class sums (exact), the within-class scatter's top r
        directions F = diag(σ)V (exact), and what the square norms say is left, ρ = Σ‖x‖²
        − Σ_c ‖S_c‖²/n_c − ‖F‖², spread evenly over the other D − r directions. The trace is
        always exact; with r at the client's rows (or D) the whole matrix is."""
        factor = self.scatter_factor
        if factor is None:
            raise ValueError("these statistics have no scatter factor (statistics-kind low-rank)")
        held = self.counts > 0
        means = self.sums[held] / self.counts[held, None]
        gram = (means * self.counts[held, None]).T @ means + factor.T @ factor
        norms = np.linalg.norm(factor, axis=1)
        basis = factor[norms > 0] / norms[norms > 0, None]
        free = gram.shape[0] - len(basis)
        residual = float(self.square_norms.sum() - np.trace(gram))
        if free > 0 and residual > 0:
            gram += residual / free * (np.eye(free + len(basis)) - basis.T @ basis)
        return gram


    def per_sample_vector(self, num_samples: int | None = None) -> np.ndarray:
        """The statistics divided by the sample count, flat (the square norms also by D, to
        sit where the other entries do): what secure aggregation averages, weighted by count.
        `num_samples`: the count to divide by when the counts carry noise (the true one)."""
        n = max(self.num_samples if num_samples is None else num_samples, 1)
        d = self.sums.shape[1]
        arrays = self.to_arrays()
        return np.concatenate([arrays["counts"] / n, arrays["sums"].ravel() / n,
                               arrays["square-norms"] / (n * d),
                               arrays.get("gram-triu", np.zeros(0)) / n]).astype(np.float64)

    @classmethod
    def from_per_sample_vector(cls, vector: np.ndarray, num_samples: int, num_classes: int,
                               num_features: int) -> "ClassStatistics":
        """The federation's sums from the count-weighted average of `per_sample_vector`s."""
        k, d = num_classes, num_features
        counts, sums, square_norms, gram = np.split(vector * num_samples,
                                                    np.cumsum([k, k * d, k]))
        arrays = {"counts": counts, "sums": sums.reshape(k, d), "square-norms": square_norms * d}
        if gram.size:
            arrays["gram-triu"] = gram
        return cls.from_arrays(arrays)


def scatter_factor(features: torch.Tensor, onehot: torch.Tensor, sums: torch.Tensor,
                   rank: int) -> np.ndarray:
    """diag(σ)V [rank, D] of the top `rank` right singular vectors of the rows less their class
    mean: the largest directions of the within-class scatter (zero rows past the client's rank).
    A thin SVD when the client has fewer rows than D, else the scatter's eigendecomposition."""
    rows = features.to(torch.float64)
    means = sums.to(torch.float64) / onehot.sum(0).clamp(min=1).to(torch.float64)[:, None]
    centred = rows - onehot.to(torch.float64) @ means
    dim = centred.shape[1]
    if len(centred) < dim:
        _, singular, basis = torch.linalg.svd(centred, full_matrices=False)
        scales = singular.square()
    else:
        scales, vectors = torch.linalg.eigh(centred.T @ centred)
        scales, basis = scales.flip(0).clamp(min=0), vectors.flip(1).T
    factor = np.zeros((min(rank, dim), dim))
    top = min(rank, dim, len(scales))
    factor[:top] = _float64(scales[:top].sqrt()[:, None] * basis[:top])
    return factor


def unpack_symmetric(upper: np.ndarray, size: int) -> np.ndarray:
    """The full symmetric matrix from its row-major upper triangle (diagonal included); one
    D x D array written in place (at D = 1280: 14 ms, against 48 ms for three arrays)."""
    if upper.shape != (size * (size + 1) // 2,):
        raise ValueError(f"a packed {size}x{size} symmetric matrix has {size * (size + 1) // 2} "
                         f"entries; got shape {upper.shape}")
    full, mask = np.zeros((size, size)), upper_mask(size)
    full[mask] = upper
    full.T[mask] = upper  # the lower triangle, mirrored: no second and third D x D array
    full += 0.0  # -0.0 to 0.0, as adding the mirrored half did: the same bits as before
    return full


@functools.lru_cache(maxsize=4)
def upper_mask(size: int) -> np.ndarray:
    """The upper triangle (diagonal included) as a read-only boolean mask, made once per size:
    indexing with it takes the entries in `np.triu_indices`' row-major order, without building
    those two index arrays per client (at D = 1280: 3.7 vs 11 ms a pack)."""
    mask = np.triu(np.ones((size, size), dtype=bool))
    mask.flags.writeable = False
    return mask


def wire_bytes(kind: str, num_classes: int, num_features: int, rank: int = 0) -> int:
    """Bytes of one client's statistics on the wire (arrays only), for the README's costs;
    `rank`: the scatter factor's rows (low-rank)."""
    if kind == "none":
        return 0
    size = num_classes * (num_features + 2)
    if kind == "gram":
        size += num_features * (num_features + 1) // 2
    if kind == "low-rank":
        size += min(rank, num_features) * num_features
    return size * np.dtype(WIRE_DTYPE).itemsize


def _float64(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float64).numpy()
