"""Loudness helpers shared by the players and the benchmarks."""
from __future__ import annotations

import numpy as np

AUDIBLE_DBFS = -40.0
WINDOW_S = 0.010


def audible_onset(samples: np.ndarray, sample_rate: int, threshold_dbfs: float = AUDIBLE_DBFS) -> int | None:
    """The first sample at which a whole 10 ms window (sliding by one sample) reaches threshold_dbfs, or None:
    audio cut there starts with a window `first_audible_sample` calls audible."""
    window = max(1, int(round(WINDOW_S * sample_rate)))
    if len(samples) < window:
        return None
    energy = np.concatenate([[0.0], np.cumsum(np.asarray(samples, dtype=np.float64) ** 2)])
    loud = np.flatnonzero(energy[window:] - energy[:-window] >= window * 10 ** (threshold_dbfs / 10))
    return int(loud[0]) if len(loud) else None


def first_audible_sample(samples: np.ndarray, sample_rate: int, threshold_dbfs: float = AUDIBLE_DBFS) -> int | None:
    """Index of the first sample of the first 10 ms window whose RMS is at or above threshold_dbfs (full scale
    = 1.0), or None. Windows start at 0 of `samples`; a trailing partial window counts with its own length."""
    window = max(1, int(round(WINDOW_S * sample_rate)))
    n = len(samples)
    if n == 0:
        return None
    padded = np.zeros(-(-n // window) * window, dtype=np.float64)
    padded[:n] = samples
    frames = padded.reshape(-1, window)
    lengths = np.full(len(frames), window)
    lengths[-1] = n - window * (len(frames) - 1)
    rms = np.sqrt((frames**2).sum(axis=1) / lengths)
    loud = np.flatnonzero(rms >= 10 ** (threshold_dbfs / 20))
    return int(loud[0]) * window if len(loud) else None


def longest_silence_s(samples: np.ndarray, sample_rate: int, threshold_dbfs: float = AUDIBLE_DBFS) -> float:
    """The longest run of 10 ms windows below threshold_dbfs between the first and the last audible one (a pause
    inside speech; the silence before and after it is not counted), in seconds."""
    window = max(1, int(round(WINDOW_S * sample_rate)))
    n = len(samples) // window
    if n == 0:
        return 0.0
    frames = np.asarray(samples[: n * window], dtype=np.float64).reshape(n, window)
    loud = np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) >= 10 ** (threshold_dbfs / 20))
    if len(loud) < 2:
        return 0.0
    return float((np.diff(loud).max() - 1) * WINDOW_S)
