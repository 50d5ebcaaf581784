"""What a codec is to the rest of the system: codes <-> audio, and a per-utterance streaming decoder.

Implemented by the mel codec (`mel_codec.MelCodec`: FSQ over log-mel, voiced by a vocoder) and the NeMo adapter
(`nemo.NemoCodec`); `load.load_codec` picks one from a folder's `codec.json`.
"""
from __future__ import annotations

from functools import cache
from typing import Protocol

import numpy as np
import torch


class StreamingDecoder(Protocol):
    """Per utterance: codes in as they are generated, audio out as soon as it is final."""
    supports_stretch: bool  # push() can render frames slower at the same pitch (pacing)

    def push(self, codes: torch.Tensor, stretch: float = 1.0) -> np.ndarray:
        """(K, n) new codes -> the audio that is final now (float32, possibly empty)."""
        ...

    def flush(self) -> np.ndarray:
        """The rest of the utterance's audio."""
        ...


class Codec(Protocol):
    sample_rate: int
    frame_rate: float
    samples_per_frame: int
    num_codebooks: int  # K
    codebook_size: int

    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """float32 audio at sample_rate -> (K, T) codes."""
        ...

    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """(K, T) codes -> float32 audio, T * samples_per_frame samples."""
        ...

    def streaming_decoder(self) -> StreamingDecoder: ...


@cache
def held_back_frames(codec: Codec) -> int:
    """Codec frames a streaming decoder must be given past a frame before all of that frame's audio is out (its
    decoder's and vocoder's right context, rounded up): measured once per codec by streaming one code at a time."""
    stream, code = codec.streaming_decoder(), torch.zeros(codec.num_codebooks, 1, dtype=torch.long)
    out = pushed = 0
    while out < codec.samples_per_frame:
        if pushed == 64:
            raise RuntimeError("the codec's streaming decoder returned no audio for 64 frames")
        out += len(stream.push(code))
        pushed += 1
    return pushed - 1
