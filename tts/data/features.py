"""Per-utterance audio and log-mel features of a corpus, the log-mel cached beside it (fp16 .npy)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from audio_io.wav import SAMPLE_RATE, read_wav, resample
from tts.codec import mel
from tts.codec.mel_codec import MelCodec


def cache_path(corpus: Path, audio_filepath: str, folder: str) -> Path:
    """corpus/folder/<the audio's path>.npy: where per-utterance features are cached (external audio under external/)."""
    rel = Path(audio_filepath)
    if rel.is_absolute():
        rel = Path("external") / rel.relative_to(rel.anchor)
    return corpus / folder / rel.with_suffix(".npy")


def load_audio(corpus: Path, audio_filepath: str) -> np.ndarray:
    path = Path(audio_filepath)
    path = path if path.is_absolute() else corpus / path
    if path.suffix.lower() == ".wav":
        audio, rate = read_wav(path)
    else:
        import soundfile

        audio, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        audio = audio.mean(axis=1)
    return resample(audio, rate, SAMPLE_RATE)


def cached_fp16(path: Path, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """float32 array kept at `path` in fp16: loaded if there, else computed, written (atomically) and returned."""
    if path.exists():
        return np.load(path).astype(np.float32)
    array = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, array.astype(np.float16))
    tmp.replace(path)
    return array


def cached_log_mel(corpus: Path, audio_filepath: str) -> np.ndarray:
    """(T, 80) float32 log-mel of one corpus utterance, computed once and kept beside the corpus in fp16."""
    path = cache_path(corpus, audio_filepath, "mels")
    return cached_fp16(path, lambda: mel.log_mel(load_audio(corpus, audio_filepath)))


def corpus_codes(codec, corpus: Path, audio_filepath: str):
    """(K, T) codes of one corpus utterance: from its cached log-mel for the mel codec, from the audio otherwise
    (the NeMo adapter)."""
    if isinstance(codec, MelCodec):
        return codec.encode_features(cached_log_mel(corpus, audio_filepath))
    return codec.encode(load_audio(corpus, audio_filepath))
