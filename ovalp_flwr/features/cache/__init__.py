"""Encoder features cached on disk, one verified folder per (dataset, encoder[, limit]).

Layout of `cache_dir/<dataset>__<encoder>/` (`<dataset>__<encoder>@limit<N>/` for a cache built
from the first N items per class, so it is never taken for the full one): `train.safetensors`
and `test.safetensors` (tensors "features" float32 [N, D] and "labels" int64 [N]) and
`manifest.json`, which records what the features are (dataset, limit, encoder identity with its
preprocessing and dtype, the options that produced it) and what the files are (shape, size,
sha256). A folder is trusted only if all of that matches; otherwise CacheError, never a silent
rebuild, since stale features would quietly change every result built on them. Builds go to a
hidden temp folder that is renamed into place only when complete, so an interrupted build leaves
nothing that is later trusted, and concurrent builders each install a complete folder.
Replacing (build_features on an existing cache) takes two renames: a reader at that instant
may find no cache and fail; load_or_build never replaces, so runs that only use it never race.

Modules: `layout` (the folder, the manifest, reading and trusting it), `build` (writing one),
`cli` (`python -m ovalp_flwr.features.cache -h`: `build`, `ls`, `verify`).
"""

from ovalp_flwr.features.cache.build import (BuildSettings, build_features, build_summary,
                                             load_or_build)
from ovalp_flwr.features.cache.cli import main, verify_folder
from ovalp_flwr.features.cache.layout import (CachedFeatures, CacheError, FeatureSet, cache_path,
                                              feature_space, load_features, read_manifest)

__all__ = ["BuildSettings", "CacheError", "CachedFeatures", "FeatureSet", "build_features",
           "build_summary", "cache_path", "feature_space", "load_features", "load_or_build",
           "main", "read_manifest", "verify_folder"]
