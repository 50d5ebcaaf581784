"""WAV files in and out (16-bit PCM), and resampling."""
from __future__ import annotations

import wave
from math import gcd
from pathlib import Path

import numpy as np
from scipy.signal import resample_poly

from audio_io.errors import UserError

SAMPLE_RATE = 22050  # the TTS's rate; WAVs read from bytes are brought to it


def read_wav_bytes(data: bytes) -> np.ndarray:
    """A WAV file's bytes -> float32 mono at SAMPLE_RATE (tolerates the bogus sizes of piped WAV headers)."""
    riff = data.find(b"fmt ")
    channels = int.from_bytes(data[riff + 10 : riff + 12], "little")
    rate = int.from_bytes(data[riff + 12 : riff + 16], "little")
    bits = int.from_bytes(data[riff + 22 : riff + 24], "little")
    start = data.find(b"data") + 8
    if bits != 16:
        raise UserError(f"expected 16-bit PCM, got {bits} bits")
    pcm = np.frombuffer(data[start : start + (len(data) - start) // 2 * 2], dtype="<i2").astype(np.float32) / 32768
    audio = pcm.reshape(-1, channels).mean(axis=1) if channels > 1 else pcm
    return resample(audio, rate, SAMPLE_RATE)


def resample(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target:
        return audio.astype(np.float32)
    g = gcd(rate, target)
    return resample_poly(audio, target // g, rate // g).astype(np.float32)


def read_wav(path) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV file -> float32 mono and its rate; anything else (an MP3, a float WAV) is one `UserError`."""
    try:
        with wave.open(str(path), "rb") as f:
            rate, channels, width = f.getframerate(), f.getnchannels(), f.getsampwidth()
            data = f.readframes(f.getnframes())
    except (wave.Error, EOFError) as error:
        raise UserError(f"{path}: not a 16-bit WAV file ({error or 'too short'}); convert it: ffmpeg -i {path} clip.wav") from None
    if width != 2:
        raise UserError(f"{path}: expected 16-bit PCM")
    audio = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768
    return (audio.reshape(-1, channels).mean(axis=1) if channels > 1 else audio), rate


def write_wav(path: Path | str, audio: np.ndarray, sample_rate: int = 22050) -> None:
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes(pcm.tobytes())
