"""WORLD vocoder features (pyworld): analysis into per-frame vectors, and synthesis back to audio.

Frame vector (FEATURE_DIM): [log F0 (interpolated through unvoiced frames), voiced flag, coded spectral
envelope (SP_DIMS), coded band aperiodicity (AP_DIMS)] every HOP samples at 22.05 kHz (86.13 frames/s).
"""
from __future__ import annotations

import warnings

import numpy as np

from tts.codec.mel import time_stretch  # noqa: F401  (frames of any kind; the streaming decoders use it)

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
# Synthesis runs on a frame grid a hair slower than the samples': with the exact period, the middle sample of
# an interval interpolates voicing to 0.5 give or take rounding, which falls on either side depending on where a
# rendering starts, so two renderings of the same frames could place pulses a sample's phase step apart
SYNTHESIS_PERIOD_MS = FRAME_PERIOD_MS * (1 + 1e-9)
UNVOICED_PULSE_HZ = 500.0  # WORLD's time base runs at this rate through unvoiced samples (its kDefaultF0)


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


def _f0_hz(features: np.ndarray) -> np.ndarray:
    """(T, D) -> (T,) F0 in Hz as WORLD's synthesis takes it: 0 where unvoiced."""
    return np.where(features[:, 1] > 0.5, np.exp(features[:, 0].astype(np.float64)), 0.0)


def pulse_phase_steps(features: np.ndarray) -> np.ndarray:
    """The phase (radians) by which WORLD's pulse train advances over each interval between consecutive frames
    of a rendering: (T, D) frames -> (T - 1,). As WORLD's synthesis does, F0 and voicing are interpolated linearly
    per sample, voicing above 0.5 counts as voiced, and unvoiced samples advance at UNVOICED_PULSE_HZ; a pulse is
    placed wherever the accumulated phase wraps. The middle sample of a voicing change takes the earlier frame's
    side (see SYNTHESIS_PERIOD_MS)."""
    f0, voiced = _f0_hz(features), (features[:, 1] > 0.5).astype(np.float64)
    t = np.arange(HOP) / HOP  # sample position within the interval
    hz = f0[:-1, None] * (1 - t) + f0[1:, None] * t  # (T - 1, HOP)
    vuv = voiced[:-1, None] * (1 - t) + voiced[1:, None] * t
    vuv[:, HOP // 2] = voiced[:-1]
    hz = np.where(vuv > 0.5, hz, UNVOICED_PULSE_HZ)
    return 2 * np.pi * hz.sum(axis=1) / SAMPLE_RATE


def continue_phase(features: np.ndarray, phase: float, lowest_hz: float = 80.0) -> np.ndarray:
    """A copy of `features` (T >= 2 frames) whose frame 0 is a voiced frame with the F0 that makes WORLD's pulse
    train, which starts afresh at frame 0, reach `phase` (mod 2 pi) at frame 1. Rendered, the copy's pulses from
    frame 1 on fall where those of a longer rendering fall when its accumulated phase at that frame is `phase`:
    a window of a stream can be synthesised alone and still continue the pulse train in phase. (Frame 0 is
    lead-in: its audio and the next ~2 frames' are not the stream's.)"""
    out = features.copy()
    out[0, 1] = 1.0
    steps = []
    for hz in (100.0, 200.0):  # the step over interval 0 is affine in frame 0's F0
        out[0, 0] = np.log(hz)
        steps.append(pulse_phase_steps(out[:2])[0])
    slope = (steps[1] - steps[0]) / 100.0
    offset = steps[0] - 100.0 * slope
    needed = (phase - offset) % (2 * np.pi)  # plus whole turns, until frame 0's F0 is plausible
    turns = max(0, int(np.ceil((lowest_hz * slope - needed) / (2 * np.pi))))
    out[0, 0] = np.log((needed + 2 * np.pi * turns) / slope)
    return out


def synthesize(features: np.ndarray) -> np.ndarray:
    """(T, FEATURE_DIM) -> float32 audio of exactly T * HOP samples."""
    f = np.ascontiguousarray(features, dtype=np.float64)
    T = len(f)
    if T == 0:
        return np.zeros(0, dtype=np.float32)
    f0 = _f0_hz(f)
    sp = pyworld.decode_spectral_envelope(np.ascontiguousarray(f[:, 2 : 2 + SP_DIMS]), SAMPLE_RATE, FFT_SIZE)
    ap = pyworld.decode_aperiodicity(np.ascontiguousarray(np.minimum(f[:, 2 + SP_DIMS :], 0.0)), SAMPLE_RATE, FFT_SIZE)
    # one extra frame so the synthesis covers T * HOP samples
    f0, sp, ap = (np.concatenate([a, a[-1:]]) for a in (f0, sp, ap))
    audio = pyworld.synthesize(f0, sp, ap, SAMPLE_RATE, frame_period=SYNTHESIS_PERIOD_MS)
    out = np.zeros(T * HOP, dtype=np.float32)
    n = min(len(audio), T * HOP)
    out[:n] = audio[:n]
    return out


