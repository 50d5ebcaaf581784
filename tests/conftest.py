import pytest
import torch

from tts.config import ModelConfig
from tts.model import TEXT_BOS, TEXT_EOS


def tiny_config(lookahead_words: int | None = 2, **overrides) -> ModelConfig:
    """dim 32, 3+3 layers: small enough for property tests, deep enough that a multi-layer leak would show."""
    fields = dict(
        phoneme_vocab_size=64, num_codebooks=3, codebook_size=20, d_model=32, n_heads=2, encoder_layers=3,
        decoder_layers=3, d_ffn=64, aux_channels=16, alignment_layers=[0, 2], dropout=0.0,
        lookahead_words=lookahead_words,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def flatten_words(words: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-word phoneme ids -> (1, T) tokens with BOS/EOS and (1, T) 1-based word ids (EOS is word N+1)."""
    tokens, word_ids = [TEXT_BOS], [1]
    for i, word in enumerate(words, start=1):
        tokens += word
        word_ids += [i] * len(word)
    tokens.append(TEXT_EOS)
    word_ids.append(len(words) + 1)  # EOS is a word of its own
    return torch.tensor([tokens]), torch.tensor([word_ids])


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
