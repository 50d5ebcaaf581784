"""Where the user's voice comes from: the microphone (a sounddevice input stream at 16 kHz, read in its own
callback thread) or an array played as if it were one (tests, benchmarks). Both yield (block, t_ns): float32 mono
samples and the perf_counter_ns time the block's first sample was captured."""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np

from audio_io.sinks import AudioDeviceError

CAPTURE_RATE = 16000
CAPTURE_BLOCK = 512  # 32 ms


class QueueMicrophone:
    """Blocks pushed from elsewhere (a browser's microphone over a WebSocket), stamped on arrival."""

    def __init__(self, rate: int = CAPTURE_RATE):
        self.rate = rate
        self._queue: asyncio.Queue = asyncio.Queue()

    def feed(self, samples: np.ndarray, captured_ns: int | None = None) -> None:
        """captured_ns: when the block's first sample was captured (default: its arrival less its duration)."""
        if captured_ns is None:
            captured_ns = time.perf_counter_ns() - round(len(samples) / self.rate * 1e9)
        self._queue.put_nowait((np.asarray(samples, np.float32), captured_ns))

    async def blocks(self) -> AsyncIterator[tuple[np.ndarray, int]]:
        while True:
            yield await self._queue.get()

    def close(self) -> None:
        pass


class Microphone(QueueMicrophone):
    """The sound card's input: its callback thread hands each block to the event loop's queue."""

    def __init__(self, device: str | int | None = None, rate: int = CAPTURE_RATE, block: int = CAPTURE_BLOCK):
        super().__init__(rate)
        try:
            import sounddevice as sd
        except (ImportError, OSError) as e:  # OSError: PortAudio library missing
            raise AudioDeviceError(f"no audio input: {e}") from e
        self._loop = asyncio.get_running_loop()
        try:
            self._stream = sd.InputStream(samplerate=rate, channels=1, dtype="float32", blocksize=block, device=device,
                                          callback=self._callback)
            self._stream.start()
        except Exception as e:  # PortAudioError and friends: no microphone, busy, bad name
            raise AudioDeviceError(f"cannot open the microphone {device if device is not None else '(default)'}: {e}") from e

    def _callback(self, indata: np.ndarray, frames: int, time_info, status) -> None:
        captured = time.perf_counter_ns() - round(frames / self.rate * 1e9)  # stamped here, not when the loop runs
        self._loop.call_soon_threadsafe(self.feed, indata[:, 0].copy(), captured)

    def close(self) -> None:
        self._stream.stop()
        self._stream.close()


class ArrayMicrophone:
    """An array played in real time as microphone blocks (or as fast as read with realtime=False)."""

    def __init__(self, audio: np.ndarray, rate: int = CAPTURE_RATE, block: int = CAPTURE_BLOCK, realtime: bool = True):
        self.audio, self.rate, self.block, self.realtime = np.asarray(audio, np.float32), rate, block, realtime

    async def blocks(self) -> AsyncIterator[tuple[np.ndarray, int]]:
        start = time.perf_counter_ns()
        for i in range(0, len(self.audio), self.block):
            captured = start + round(i / self.rate * 1e9)
            if self.realtime:  # a block is available once its last sample has been "spoken"
                await asyncio.sleep(max(0.0, (captured + round(self.block / self.rate * 1e9) - time.perf_counter_ns()) / 1e9))
            else:
                await asyncio.sleep(0)
            yield self.audio[i : i + self.block], captured

    def close(self) -> None:
        pass
