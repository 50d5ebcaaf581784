"""FSQ codes, and the time stretch that pacing renders the codec's log-mel with."""
import numpy as np
import pytest
import torch

from tts.codec.fsq import FSQ
from tts.codec.mel import time_stretch


def test_fsq_codes_round_trip():
    fsq = FSQ([8, 5, 5, 5], groups=8)
    q = fsq.quantize(torch.randn(2, fsq.dim, 30) * 3)
    codes = fsq.to_codes(q)
    assert codes.shape == (2, 8, 30) and codes.min() >= 0 and codes.max() < 1000
    assert torch.allclose(fsq.from_codes(codes), q, atol=1e-6)
    every = torch.arange(1000).view(1, 1, 1000).expand(1, 8, 1000)
    assert torch.equal(fsq.to_codes(fsq.from_codes(every)), every)  # all 1000 codes reachable


def test_time_stretch_slows_features_down_smoothly():
    ramp = np.arange(10, dtype=np.float32)[:, None].repeat(3, axis=1)
    assert time_stretch(ramp, 1.0) is ramp
    slow = time_stretch(ramp, 1.5, previous=np.full(3, -1.0, dtype=np.float32))
    assert slow.shape == (15, 3) and slow[-1, 0] == pytest.approx(9.0)  # ends where the chunk ends
    assert np.all(np.diff(slow[:, 0]) > 0) and slow[0, 0] > -1.0  # monotone, continuing from the previous frame
    assert np.all(np.diff(slow[:, 0]) <= 1.0)  # no jumps: interpolated, never skipped
