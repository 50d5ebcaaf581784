"""Model configuration: one dataclass saved with every checkpoint, loaded from YAML with unknown keys refused."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from math import prod as np_prod
from pathlib import Path
from typing import Any

from audio_io.errors import UserError
from tts.paths import CONFIGS
from tts.typed_yaml import build, read_yaml

CONFIG_DIR = CONFIGS


@dataclass
class ModelConfig:
    # vocabularies
    phoneme_vocab_size: int = 128  # size of the phoneme symbol table, specials included
    num_codebooks: int = 8  # K: codec codebooks predicted per frame
    codebook_size: int = 1000  # codes per codebook; BOS and EOS follow at codebook_size, codebook_size + 1
    # FSQ levels of each code (mixed radix, first level varies fastest). Set: code embeddings and output logits are
    # factorised over the digits (a code's logit is the sum of its digits' logits), so neighbouring levels are
    # learned as related values instead of 1000 unrelated symbols. None: one free embedding / logit per code.
    code_levels: list[int] | None = None
    # transformer
    d_model: int = 256
    n_heads: int = 4
    encoder_layers: int = 3  # the last one carries the lookahead, the others are word-causal
    decoder_layers: int = 4
    d_ffn: int = 1024
    encoder_ffn_kernel: int = 3  # causal conv kernel of the word-causal encoder layers' FFN (1 = pointwise)
    dropout: float = 0.1
    # streaming: k lookahead words; None is the full-context T5-TTS baseline
    lookahead_words: int | None = 2
    # conv auxiliary attention (alignment)
    aux_channels: int = 128
    aux_delta: float = 5e-5
    prior_scaling: float = 1.0  # beta-binomial prior: a = scaling * (s + 1), b = scaling * (S - s)
    # decoder cross-attention layers read for the CTC loss and for word-completion detection
    alignment_layers: list[int] = field(default_factory=lambda: [1, 2])
    # classifier-free guidance (Koel-TTS, NeMo MagpieTTS): this share of training rows sees a learned null state in
    # place of every text memory slot, so the model also learns to speak without the text; 0: no null state
    cfg_dropout: float = 0.0
    # loss weights
    ce_weight: float = 1.0
    aux_loss_weight: float = 1.0
    cross_ctc_weight: float = 0.1

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise UserError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.lookahead_words is not None and self.lookahead_words < 0:
            raise UserError("lookahead_words must be >= 0 or null")
        if not 0.0 <= self.cfg_dropout < 1.0:
            raise UserError(f"cfg_dropout {self.cfg_dropout} must be in [0, 1)")
        if self.encoder_layers < 1 or self.decoder_layers < 1:
            raise UserError("the model needs at least one encoder and one decoder layer")
        if self.code_levels is not None and int(np_prod(self.code_levels)) != self.codebook_size:
            raise UserError(f"code_levels {self.code_levels} do not multiply to codebook_size {self.codebook_size}")
        bad = [i for i in self.alignment_layers if not 0 <= i < self.decoder_layers]
        if bad or not self.alignment_layers:
            raise UserError(f"alignment_layers {self.alignment_layers} must index decoder layers 0..{self.decoder_layers - 1}")

    @property
    def bos_id(self) -> int:
        return self.codebook_size

    @property
    def eos_id(self) -> int:
        return self.codebook_size + 1

    @property
    def code_vocab_size(self) -> int:
        return self.codebook_size + 2

    @property
    def streaming(self) -> bool:
        return self.lookahead_words is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def from_dict(cls: type, data: dict[str, Any], where: str = "config"):
    """Build a config dataclass from a mapping; a key the dataclass lacks or a value of the wrong type is an error
    (`tts/typed_yaml.py`), not a silent no-op or a failure much later."""
    return build(cls, data, where)


def resolve_config_path(name_or_path: str | Path) -> Path:
    """`s5_default` -> configs/s5_default.yaml; an existing path is used as is."""
    path = Path(name_or_path)
    if path.exists():
        return path
    candidate = CONFIG_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    raise UserError(f"no config {name_or_path!r} (looked at {path} and {candidate})")


def load_model_config(name_or_path: str | Path) -> ModelConfig:
    """Read the `model:` section of a YAML config."""
    path = resolve_config_path(name_or_path)
    data = read_yaml(path) or {}
    if not isinstance(data, dict) or "model" not in data:
        raise UserError(f"{path}: expected a mapping with a 'model' section")
    return from_dict(ModelConfig, data["model"] or {}, f"{path}: model")
