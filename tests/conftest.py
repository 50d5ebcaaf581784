import pytest
import torch

from tts.model.batch import TEXT_BOS, TEXT_EOS
from tts.model.config import ModelConfig


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


@pytest.fixture(scope="session")
def tiny_bundle():
    """A tiny random S5/T5 model behind the real G2P and a small random codec: the control flow, not the voice.
    tiny_bundle(k) gives an S5 bundle with k lookahead words, tiny_bundle(None) a full-context one."""
    from tts.codec.istft_vocoder import IstftGenerator, IstftVocoderConfig
    from tts.codec.mel_codec import MelCodec, MelCodecConfig, MelCodecModel
    from tts.codec.vocoder import Vocoder
    from tts.frontend.g2p import G2P, SymbolTable
    from tts.inference.synthesis import TTSBundle
    from tts.model.s5tts import S5TTS

    g2p = G2P()
    torch.manual_seed(0)
    vocoder = Vocoder(IstftGenerator(IstftVocoderConfig(dim=32, intermediate=64, layers=2)))
    codec = MelCodec(MelCodecModel(MelCodecConfig(channels=32)), vocoder)

    def make(lookahead):
        torch.manual_seed(0)
        config = tiny_config(lookahead, phoneme_vocab_size=len(SymbolTable.default()), num_codebooks=8, codebook_size=1000)
        return TTSBundle(S5TTS(config), SymbolTable.default(), codec, g2p)

    return make
