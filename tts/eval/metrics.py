"""Offline speech quality metrics: Whisper tiny.en ASR -> WER/CER, resemblyzer speaker similarity, Distill-MOS and
DNSMOS for naturalness. Judge naturalness by Distill-MOS first: it ranks TTS voices as listeners do (Piper 4.04 >
festival HTS 3.05 > flite 2.84 > espeak-ng 2.33 on 40 unseen sentences), where DNSMOS, built for noisy calls,
compresses those differences.

The ASR is the one the agent listens with (`audio_io.asr`: Whisper tiny.en, offline). On the Piper voice it misses
about 11% of the words, where pocketsphinx missed 23-37% and so hid codec losses."""
from __future__ import annotations

import re
import warnings
from functools import lru_cache

import numpy as np

from audio_io.asr import ASR_RATE, transcribe  # noqa: F401  (transcribe: re-exported for the benches)
from audio_io.wav import resample
from tts.frontend.text import normalize_text


# Contractions spelled out, as Whisper's own English normaliser does: Whisper writes "you're" for a spoken "you
# are" as often as not, and scored as written that is two errors where no word was lost ("'s" -> "is" possessives
# too, on both sides alike)
CONTRACTIONS = ((r"\bwon't\b", "will not"), (r"\bcan't\b", "can not"), (r"\blet's\b", "let us"),
                (r"n't\b", " not"), (r"'re\b", " are"), (r"'s\b", " is"), (r"'d\b", " would"),
                (r"'ll\b", " will"), (r"'ve\b", " have"), (r"'m\b", " am"))


def words_for_scoring(text: str) -> str:
    """Normalised, lower-case, punctuation-free words with contractions spelled out: what both the reference and
    the ASR output are scored as."""
    words = normalize_text(text)
    joined = " ".join(re.sub(r"[^a-z' ]", " ", w.lower()).strip() for w in words if re.sub(r"[^a-z]", "", w.lower()))
    for pattern, spelled in CONTRACTIONS:
        joined = re.sub(pattern, spelled, joined)
    return " ".join(joined.replace("'", " ").split())


def error_rates(references: list[str], hypotheses: list[str]) -> tuple[float, float]:
    """Corpus WER and CER in percent."""
    import jiwer

    refs = [words_for_scoring(r) or "-" for r in references]
    hyps = [words_for_scoring(h) for h in hypotheses]
    return 100 * jiwer.wer(refs, hyps), 100 * jiwer.cer(refs, hyps)


@lru_cache(maxsize=1)
def _voice_encoder():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from resemblyzer import VoiceEncoder

        return VoiceEncoder(device="cpu", verbose=False)


def speaker_embedding(audio: np.ndarray, rate: int) -> np.ndarray:
    from resemblyzer import preprocess_wav

    return _voice_encoder().embed_utterance(preprocess_wav(resample(audio, rate, ASR_RATE), source_sr=ASR_RATE))


def speaker_similarity(a: np.ndarray, b: np.ndarray, rate: int) -> float:
    ea, eb = speaker_embedding(a, rate), speaker_embedding(b, rate)
    return float(np.dot(ea, eb) / (np.linalg.norm(ea) * np.linalg.norm(eb)))


def dnsmos(audio: np.ndarray, rate: int) -> float:
    """DNSMOS overall (1-5, higher is better)."""
    from speechmos import dnsmos as model

    x = resample(audio, rate, ASR_RATE)
    peak = float(np.abs(x).max()) if len(x) else 0.0
    if peak > 1.0:
        x = x / peak
    return float(model.run(x, ASR_RATE)["ovrl_mos"])


@lru_cache(maxsize=1)
def _distillmos_model():
    """Distill-MOS (Stahl & Gamper 2025; PyPI `distillmos`, its weights in the wheel). The package imports
    torchaudio at the top for its own command line only; torchaudio would replace the pinned torch, so an empty
    module stands in for it while the model class is imported (installed with `--no-deps` by setup.sh)."""
    import contextlib
    import io
    import sys
    import types

    import torch

    shimmed = "torchaudio" not in sys.modules
    if shimmed:
        sys.modules["torchaudio"] = types.ModuleType("torchaudio")
    try:
        from distillmos import ConvTransformerSQAModel
    finally:
        if shimmed:
            del sys.modules["torchaudio"]
    with contextlib.redirect_stdout(io.StringIO()):  # it prints where it loaded its weights from
        model = ConvTransformerSQAModel().eval()
    return model, torch


def distillmos(audio: np.ndarray, rate: int) -> float:
    """Distill-MOS (1-5, higher is better): ranks TTS voices as listeners do, where DNSMOS compresses them."""
    model, torch = _distillmos_model()
    x = resample(audio, rate, ASR_RATE).astype(np.float32)
    if not len(x) or float(np.abs(x).max()) < 1e-6:
        return 1.0  # silence: the model would divide by its peak
    with torch.inference_mode():
        return float(model(torch.from_numpy(x)[None]).item())
