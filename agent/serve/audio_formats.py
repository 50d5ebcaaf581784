"""The audio formats of `POST /v1/audio/speech`, as OpenAI's speech endpoint names them: each an encoder that takes
float samples as they are synthesised and gives the bytes to send now.

- `pcm`: raw 16-bit little-endian mono at the codec's rate (`X-Sample-Rate` says which);
- `mp3`, `opus` (in Ogg, at 48 kHz as Opus requires), `aac` (ADTS), `flac`: FFmpeg's encoders through PyAV
  (`av`), streamed: each packet leaves as soon as the encoder gives it;
- `wav`: 16-bit mono with its true length in the header, so it is sent whole once the reply is synthesised (a
  streamed WAV's header cannot know its length; ask for `pcm` to stream uncompressed audio).

One encoder per response; nothing is shared between requests.
"""
from __future__ import annotations

import io
import struct

import numpy as np

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}
_AV = {  # format -> (container, codec, output rate: None keeps the codec's)
    "mp3": ("mp3", "libmp3lame", None),
    "opus": ("ogg", "libopus", 48000),
    "aac": ("adts", "aac", None),
    "flac": ("flac", "flac", None),
}


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def wav_bytes(pcm: bytes, sample_rate: int) -> bytes:
    """A whole 16-bit mono WAV: header with the true sizes, then the samples."""
    return (b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVE" + b"fmt " + struct.pack(
        "<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16) + b"data" + struct.pack("<I", len(pcm)) + pcm)


class _Outbox:
    """Where the muxer writes: bytes collect here until taken. Not seekable, so every muxer writes a stream."""

    def __init__(self):
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self._parts = b"".join(self._parts), []
        return data


class Encoder:
    """`encode(samples)` -> bytes to send now; `finish()` -> the rest."""
    streams = True  # whether bytes leave before the end

    def __init__(self, fmt: str, sample_rate: int):
        self.format, self.sample_rate = fmt, sample_rate
        self.content_type = CONTENT_TYPES[fmt]
        self._pcm: list[bytes] = []
        self._av = None
        if fmt in _AV:
            import av

            container, codec, rate = _AV[fmt]
            self._outbox = _Outbox()
            self._av = av.open(self._outbox, mode="w", format=container)
            self._stream = self._av.add_stream(codec, rate=rate or sample_rate, layout="mono")
            self._resampler = av.AudioResampler(format=self._stream.codec_context.format, layout="mono",
                                                rate=rate or sample_rate)
        self.streams = fmt != "wav"

    def encode(self, samples: np.ndarray) -> bytes:
        data = pcm16(samples)
        if self.format == "pcm":
            return data
        if self.format == "wav":
            self._pcm.append(data)
            return b""
        return self._mux(np.frombuffer(data, dtype="<i2"))

    def finish(self) -> bytes:
        if self.format == "pcm":
            return b""
        if self.format == "wav":
            return wav_bytes(b"".join(self._pcm), self.sample_rate)
        out = self._mux(None)
        self._av.close()
        return out + self._outbox.take()

    def _mux(self, pcm: np.ndarray | None) -> bytes:
        import av

        frame = None
        if pcm is not None:
            if not len(pcm):
                return b""
            frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
            frame.sample_rate = self.sample_rate
        for resampled in self._resampler.resample(frame):
            for packet in self._stream.encode(resampled):
                self._av.mux(packet)
        if pcm is None:
            for packet in self._stream.encode(None):
                self._av.mux(packet)
        return self._outbox.take()


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Any of the formats back to float mono samples and their rate (tests, and clients that want to check)."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=stream.rate)
        parts = [f.to_ndarray().reshape(-1) for frame in container.decode(stream) for f in resampler.resample(frame)]
        parts += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
        return (np.concatenate(parts) if parts else np.zeros(0, np.float32)), stream.rate
