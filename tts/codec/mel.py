"""Log-mel features exactly as the HiFi-GAN universal V1 vocoder was trained on them: 22.05 kHz, n_fft 1024,
hop 256, Hann window 1024, centred frames (reflect padding), 80 Slaney mel bands over 0-8 kHz, natural log of the
magnitude mel clamped at 1e-5. One frame per 256 samples: 86.13 frames/s."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

SAMPLE_RATE = 22050
N_FFT = 1024
HOP = 256
N_MELS = 80
F_MIN, F_MAX = 0.0, 8000.0
LOG_FLOOR = float(np.log(1e-5))  # silence: the value every band takes below the clamp
FRAME_RATE = SAMPLE_RATE / HOP


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above (librosa's default, htk=False)."""
    f = np.asarray(f, dtype=np.float64)
    linear = f / (200.0 / 3)
    log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log, linear)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), m * (200.0 / 3))


@lru_cache(maxsize=1)
def mel_filterbank() -> np.ndarray:
    """(80, 513) triangular Slaney-normalised filters, equal to librosa.filters.mel(sr=22050, n_fft=1024,
    n_mels=80, fmin=0, fmax=8000) (tested), without importing librosa on the inference path."""
    fft_freqs = np.linspace(0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    mel_points = _mel_to_hz(np.linspace(_hz_to_mel(F_MIN), _hz_to_mel(F_MAX), N_MELS + 2))
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2:] - mel_points[:-2]))[:, None]
    return weights.astype(np.float32)


@lru_cache(maxsize=1)
def _torch_basis() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(mel_filterbank()), torch.hann_window(N_FFT)


def num_frames(num_samples: int) -> int:
    return 1 + num_samples // HOP


def log_mel_torch(audio: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """(B, n) float audio -> (B, 1 + n // 256, 80) log-mel; differentiable with eps > 0 (vocoder training's mel
    loss: |X| = sqrt(power + eps) has a gradient at 0)."""
    basis, window = _torch_basis()
    spec = torch.stft(audio, N_FFT, HOP, N_FFT, window.to(audio.device), center=True, pad_mode="reflect",
                      return_complex=True)
    magnitude = torch.sqrt(spec.real.square() + spec.imag.square() + eps) if eps else spec.abs()
    return torch.log(torch.clamp(basis.to(audio.device) @ magnitude, min=1e-5)).transpose(1, 2)


def log_mel(audio: np.ndarray | torch.Tensor) -> np.ndarray:
    """(n,) float audio at 22.05 kHz -> (1 + n // 256, 80) float32 log-mel frames."""
    x = torch.as_tensor(np.asarray(audio, dtype=np.float32))
    if len(x) < N_FFT // 2 + 1:  # reflect padding needs more samples than half a window
        x = torch.nn.functional.pad(x, (0, N_FFT // 2 + 1 - len(x)))
    with torch.no_grad():
        mel = log_mel_torch(x[None])[0]
    return mel.contiguous().numpy()[: num_frames(len(audio))]


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
