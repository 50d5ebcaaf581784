"""WORLD vocoder features (pyworld): analysis into per-frame vectors, and synthesis back to audio.

Frame vector (FEATURE_DIM): [log F0 (interpolated through unvoiced frames), voiced flag, coded spectral
envelope (SP_DIMS), coded band aperiodicity (AP_DIMS)] every HOP samples at 22.05 kHz (86.13 frames/s).
"""
from __future__ import annotations

import warnings

import numpy as np

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # pyworld imports pkg_resources
    import pyworld

SAMPLE_RATE = 22050
HOP = 256
FFT_SIZE = 1024
SP_DIMS = 40
AP_DIMS = pyworld.get_num_aperiodicities(SAMPLE_RATE)
FEATURE_DIM = 2 + SP_DIMS + AP_DIMS
FRAME_PERIOD_MS = 1000.0 * HOP / SAMPLE_RATE
F0_FLOOR, F0_CEIL = 60.0, 500.0


def analyze(audio: np.ndarray) -> np.ndarray:
    """float audio at 22.05 kHz -> (T, FEATURE_DIM) float32, T = len(audio) // HOP + 1. Harvest for F0 (dio makes
    octave errors on low voices)."""
    x = np.ascontiguousarray(audio, dtype=np.float64)
    f0, times = pyworld.harvest(x, SAMPLE_RATE, frame_period=FRAME_PERIOD_MS, f0_floor=F0_FLOOR, f0_ceil=F0_CEIL)
    sp = pyworld.cheaptrick(x, f0, times, SAMPLE_RATE, fft_size=FFT_SIZE)
    ap = pyworld.d4c(x, f0, times, SAMPLE_RATE, fft_size=FFT_SIZE)
    voiced = f0 > 0
    log_f0 = np.zeros_like(f0)
    if voiced.any():
        idx = np.arange(len(f0))
        log_f0 = np.interp(idx, idx[voiced], np.log(f0[voiced]))
    else:
        log_f0[:] = np.log(100.0)
    coded_sp = pyworld.code_spectral_envelope(sp, SAMPLE_RATE, SP_DIMS)
    coded_ap = pyworld.code_aperiodicity(ap, SAMPLE_RATE)
    return np.concatenate([log_f0[:, None], voiced[:, None].astype(np.float64), coded_sp, coded_ap], axis=1).astype(np.float32)


def synthesize(features: np.ndarray) -> np.ndarray:
    """(T, FEATURE_DIM) -> float32 audio of exactly T * HOP samples."""
    f = np.ascontiguousarray(features, dtype=np.float64)
    T = len(f)
    if T == 0:
        return np.zeros(0, dtype=np.float32)
    f0 = np.where(f[:, 1] > 0.5, np.exp(f[:, 0]), 0.0)
    sp = pyworld.decode_spectral_envelope(np.ascontiguousarray(f[:, 2 : 2 + SP_DIMS]), SAMPLE_RATE, FFT_SIZE)
    ap = pyworld.decode_aperiodicity(np.ascontiguousarray(np.minimum(f[:, 2 + SP_DIMS :], 0.0)), SAMPLE_RATE, FFT_SIZE)
    # one extra frame so the synthesis covers T * HOP samples
    f0, sp, ap = (np.concatenate([a, a[-1:]]) for a in (f0, sp, ap))
    audio = pyworld.synthesize(f0, sp, ap, SAMPLE_RATE, frame_period=FRAME_PERIOD_MS)
    out = np.zeros(T * HOP, dtype=np.float32)
    n = min(len(audio), T * HOP)
    out[:n] = audio[:n]
    return out


def time_stretch(features: np.ndarray, factor: float, previous: np.ndarray | None = None) -> np.ndarray:
    """Slow speech down (factor > 1) without changing its pitch: (n, D) frames -> (round(n * factor), D) frames
    linearly interpolated in time. `previous` (the frame before these, if any) keeps consecutive chunks continuous.
    factor 1 returns the frames unchanged."""
    n = len(features)
    m = max(1, round(n * factor)) if n else 0
    if m == n:
        return features
    frames = features if previous is None else np.concatenate([previous[None], features])
    offset = 0 if previous is None else 1
    positions = np.clip((np.arange(m) + 1) * (n / m) - 1 + offset, 0, len(frames) - 1)  # last one lands on n - 1
    low = np.floor(positions).astype(int)
    high = np.minimum(low + 1, len(frames) - 1)
    weight = (positions - low)[:, None].astype(np.float32)
    return (frames[low] * (1 - weight) + frames[high] * weight).astype(np.float32)
