"""Where audio goes: the sound card (sounddevice callback stream), a WAV file, or nowhere (null).

Every sink keeps one playback timeline per turn: `begin_turn()`, `write()` chunks as they are ready,
`end_turn()` when no more will come, `await drain()` until the listener has heard it all, `flush()` to drop
what is queued (barge-in). `stats` has the first audible sample (first 10 ms window >= -40 dBFS, as played),
underruns (the player ran dry while the turn still had audio to come) and their total length.
The WAV and null sinks play on a simulated real-time clock, so headless runs report the same figures.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from audio_io.errors import UserError

from .echo import PlaybackLevels
from .levels import first_audible_sample
from .wav import write_wav

START_BUFFER_MS = 40.0  # jitter buffer: playback starts once this much audio is queued (or the turn ended); about two
# device blocks of 512 samples: the engine's first chunk carries 40-70 ms of sound and the next follows within ~25 ms


class AudioDeviceError(UserError):
    pass


@dataclass
class PlaybackStats:
    first_audible_ns: int | None = None
    first_played_ns: int | None = None
    underruns: int = 0
    underrun_ms: float = 0.0
    played_samples: int = 0
    last_sample_ns: int | None = None  # when the last written sample will have played
    gaps: list[list[float]] = field(default_factory=list)  # [audio seconds played before the gap, gap ms] per underrun


class ClockSink:
    """Null sink: plays nothing, on a real-time clock. Playback starts with the first chunk of a turn; a chunk
    that arrives after the previous one finished playing is an underrun."""

    def __init__(self, sample_rate: int, pace: bool = True, start_buffer_ms: float = START_BUFFER_MS):
        self.sample_rate = sample_rate
        self.pace = pace  # drain() waits for the simulated playback to finish (False: return at once)
        self.start_samples = round(start_buffer_ms / 1000 * sample_rate)
        self.stats = PlaybackStats()
        self.levels = PlaybackLevels()  # what played when, across turns (the microphone's echo reference)
        self._clock: int | None = None
        self._waiting: list[np.ndarray] = []  # audio held until the jitter buffer is full
        self._audible_found = False
        self._play_after_ns = 0
        self._held = False
        self._turn_ended = False

    output_latency_ns = 0  # a simulated player is silent the moment it is flushed

    def begin_turn(self, held: bool = False) -> None:
        """held: queue the turn's audio but play none of it until `release()` (a turn started on a guess)."""
        self.stats = PlaybackStats()
        self._clock = None
        self._waiting = []
        self._audible_found = False
        self._play_after_ns = 0
        self._held = held
        self._turn_ended = False

    def release(self) -> None:
        """A held turn may play now: what is queued starts as it would have (buffer full, or the turn ended)."""
        self._held = False
        if self._clock is None and self._waiting and (self._turn_ended or self._buffer_full()):
            self._start(self._play_after_ns)

    def _buffer_full(self) -> bool:
        """Enough audio waits to fill the jitter buffer."""
        return sum(len(w) for w in self._waiting) >= self.start_samples

    def write(self, samples: np.ndarray, play_after_ns: int | None = None) -> None:
        """play_after_ns: do not start the turn before then (the engine's pacing prebuffer)."""
        if not len(samples):
            return
        samples = np.clip(samples, -1.0, 1.0).astype(np.float32)  # as a sound card would
        if self._clock is None:  # not playing yet: fill the jitter buffer first
            self._play_after_ns = max(self._play_after_ns, play_after_ns or 0)
            self._waiting.append(samples)
            if not self._held and self._buffer_full():
                self._start(self._play_after_ns)
            return
        self._play(samples)

    def _start(self, not_before_ns: int = 0) -> None:
        self._clock = max(time.perf_counter_ns(), not_before_ns)  # a simulated clock may start in the future
        self.stats.first_played_ns = self._clock
        waiting, self._waiting = self._waiting, []
        for samples in waiting:
            self._play(samples, now=self.stats.first_played_ns)

    def _play(self, samples: np.ndarray, now: int | None = None) -> None:
        now = now if now is not None else time.perf_counter_ns()
        s = self.stats
        if now > self._clock:
            s.underruns += 1
            s.underrun_ms += (now - self._clock) / 1e6
            s.gaps.append([s.played_samples / self.sample_rate, (now - self._clock) / 1e6])
            self._clock = now
        if not self._audible_found:
            index = first_audible_sample(samples, self.sample_rate)
            if index is not None:
                s.first_audible_ns = self._clock + round(index / self.sample_rate * 1e9)
                self._audible_found = True
        self.levels.add(self._clock, samples, self.sample_rate)
        self._clock += round(len(samples) / self.sample_rate * 1e9)
        s.played_samples += len(samples)
        s.last_sample_ns = self._clock
        self._record(samples)

    def _record(self, samples: np.ndarray) -> None:
        pass

    def end_turn(self) -> None:
        self._turn_ended = True
        if self._clock is None and self._waiting and not self._held:  # the whole reply is in (shorter than the buffers): play now
            self._start()

    async def drain(self) -> None:
        while self._held and self._waiting:  # a held turn is not over until released (or flushed)
            await asyncio.sleep(0.005)
        if self.pace and self.stats.last_sample_ns is not None:
            await asyncio.sleep(max(0.0, (self.stats.last_sample_ns - time.perf_counter_ns()) / 1e9))

    def flush(self) -> int:
        """Barge-in: whatever has not played yet is dropped. Returns the samples dropped."""
        self._waiting = []
        now = time.perf_counter_ns()
        self.levels.forget_after(now)
        if self._clock is None or self._clock <= now:
            return 0
        unplayed = min(self.stats.played_samples, round((self._clock - now) / 1e9 * self.sample_rate))
        self.stats.played_samples -= unplayed
        self._clock = now
        self.stats.last_sample_ns = now
        return unplayed

    def close(self) -> None:
        pass


class WavSink(ClockSink):
    """Records what was played (16-bit mono WAV): `save(path)` writes and clears it, e.g. once per turn."""

    def __init__(self, sample_rate: int, path: Path | str, pace: bool = True):
        super().__init__(sample_rate, pace)
        self.path = Path(path)
        self._parts: list[np.ndarray] = []

    def _record(self, samples: np.ndarray) -> None:
        self._parts.append(samples.astype(np.float32))

    def flush(self) -> int:
        dropped = super().flush()
        if dropped:  # the listener never heard it: cut it from the recording too
            audio = np.concatenate(self._parts)
            self._parts = [audio[: len(audio) - dropped]]
        return dropped

    def audio(self) -> np.ndarray:
        """What was played since the last save (less what a barge-in cut)."""
        return np.concatenate(self._parts) if self._parts else np.zeros(0, np.float32)

    def clear_recording(self) -> None:
        """Forget what was recorded (a long replay that keeps no WAVs)."""
        self._parts = []

    def save(self, path: Path | str | None = None) -> Path:
        target = Path(path) if path else self.path
        target.parent.mkdir(parents=True, exist_ok=True)
        write_wav(target, self.audio(), self.sample_rate)
        self._parts = []
        return target

    def close(self) -> None:
        if self._parts:
            self.save()


class DeviceSink:
    """The sound card through a sounddevice callback stream fed from a thread-safe buffer. The callback
    zero-fills when the buffer runs dry (an underrun while the turn still has audio to come) and stamps the first
    audible sample with the time the device will play it."""

    def __init__(self, sample_rate: int, device: str | int | None = None, blocksize: int = 512,
                 start_buffer_ms: float = START_BUFFER_MS):
        try:
            import sounddevice as sd
        except (ImportError, OSError) as e:  # OSError: PortAudio library missing
            raise AudioDeviceError(f"no audio output: {e}") from e
        self.sample_rate = sample_rate
        self.start_samples = round(start_buffer_ms / 1000 * sample_rate)
        self.stats = PlaybackStats()
        self.levels = PlaybackLevels()  # what played when, across turns (the microphone's echo reference)
        self._lock = threading.Lock()
        self._queue: deque[np.ndarray] = deque()
        self._offset = 0  # samples of _queue[0] already played
        self._turn_open = False
        self._started = False
        self._audible_found = False
        self._dry_since: int | None = None
        self._play_after_ns = 0  # the engine's pacing prebuffer: the turn does not start before then
        self._held = False  # a turn started on a guess: nothing plays until release()
        self._idle = threading.Event()
        self._idle.set()
        try:
            self._stream = sd.OutputStream(samplerate=sample_rate, channels=1, dtype="float32", device=device,
                                           blocksize=blocksize, callback=self._callback)
            self._stream.start()
        except Exception as e:  # PortAudioError and friends: no device, busy device, bad name
            raise AudioDeviceError(f"cannot open audio device {device if device is not None else '(default)'}: {e}") from e

    def _callback(self, out: np.ndarray, frames: int, time_info, status) -> None:
        now = time.perf_counter_ns()
        dac_delay_ns = max(0, round((time_info.outputBufferDacTime - time_info.currentTime) * 1e9))
        filled = 0
        with self._lock:
            if not self._started and self._ready_to_start(now):
                self._started = True
            while filled < frames and self._queue and self._started:
                head = self._queue[0]
                take = min(frames - filled, len(head) - self._offset)
                block = head[self._offset : self._offset + take]
                out[filled : filled + take, 0] = block
                if not self._audible_found:
                    index = first_audible_sample(block, self.sample_rate)
                    if index is not None:
                        self.stats.first_audible_ns = now + dac_delay_ns + round((filled + index) / self.sample_rate * 1e9)
                        self._audible_found = True
                if self.stats.first_played_ns is None:
                    self.stats.first_played_ns = now + dac_delay_ns + round(filled / self.sample_rate * 1e9)
                filled += take
                self._offset += take
                if self._offset >= len(head):
                    self._queue.popleft()
                    self._offset = 0
            self.stats.played_samples += filled
            if filled:
                self.levels.add(now + dac_delay_ns, out[:filled, 0], self.sample_rate)
            if filled < frames:
                out[filled:, 0] = 0.0
                if self._started and self._turn_open:  # ran dry while more audio is due
                    if self._dry_since is None:
                        self.stats.underruns += 1
                        self.stats.gaps.append([self.stats.played_samples / self.sample_rate, 0.0])
                        self._dry_since = now
                elif not self._queue:
                    self._idle.set()
            elif self._dry_since is not None:
                self._end_gap(now)
            if filled == frames and not self._queue and not self._turn_open:
                self._idle.set()

    def _end_gap(self, now: int) -> None:
        """The player has audio again (called with the lock held)."""
        gap_ms = (now - self._dry_since) / 1e6
        self.stats.underrun_ms += gap_ms
        self.stats.gaps[-1][1] = gap_ms
        self._dry_since = None

    @property
    def output_latency_ns(self) -> int:
        """Audio already handed to the device plays this long after a flush."""
        return round(float(getattr(self._stream, "latency", 0.0) or 0.0) * 1e9)

    def begin_turn(self, held: bool = False) -> None:
        """held: queue the turn's audio but play none of it until `release()` (a turn started on a guess)."""
        with self._lock:
            self.stats = PlaybackStats()
            self._turn_open = True
            self._started = False
            self._audible_found = False
            self._dry_since = None
            self._play_after_ns = 0
            self._held = held

    def release(self) -> None:
        with self._lock:
            self._held = False
            self._started = not self._turn_open or self._ready_to_start(time.perf_counter_ns())

    def _ready_to_start(self, now: int) -> bool:
        """The jitter buffer is full and the prebuffer time (if any) has passed. Called with the lock held."""
        return not self._held and self._queued() >= self.start_samples and now >= self._play_after_ns

    def _queued(self) -> int:
        """Samples written and not yet played. Called with the lock held."""
        return sum(len(q) for q in self._queue) - self._offset

    def write(self, samples: np.ndarray, play_after_ns: int | None = None) -> None:
        """play_after_ns: do not start the turn before then (the engine's pacing prebuffer)."""
        if not len(samples):
            return
        with self._lock:
            if not self._started:
                self._play_after_ns = max(self._play_after_ns, play_after_ns or 0)
            if self._dry_since is not None:
                self._end_gap(time.perf_counter_ns())
            self._queue.append(np.clip(samples, -1.0, 1.0).astype(np.float32))  # never wrap around on overflow
            self._idle.clear()
            queued = self._queued()
            self._started = self._started or self._ready_to_start(time.perf_counter_ns())  # buffer full: play
            self.stats.last_sample_ns = time.perf_counter_ns() + round(queued / self.sample_rate * 1e9)

    def end_turn(self) -> None:
        with self._lock:
            self._turn_open = False
            self._started = not self._held  # whatever is queued plays now, however short (once released)
            self._dry_since = None
            if not self._queue:
                self._idle.set()

    async def drain(self) -> None:
        while not self._idle.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(self._stream.latency if hasattr(self._stream, "latency") else 0.0)

    def flush(self) -> int:
        with self._lock:
            dropped = self._queued()
            self._queue.clear()
            self._offset = 0
            self._dry_since = None
            self._idle.set()
        return dropped

    def close(self) -> None:
        self._stream.stop()
        self._stream.close()


def open_sink(kind: str, sample_rate: int, wav_path: Path | str = "s5_output.wav", device: str | int | None = None,
              notice=print) -> ClockSink | DeviceSink:
    """kind: auto | device | wav | null. auto tries the sound card and falls back to a WAV file with a one-line
    notice (headless machines, CI)."""
    if kind == "null":
        return ClockSink(sample_rate)
    if kind == "wav":
        return WavSink(sample_rate, wav_path)
    if kind not in ("auto", "device"):
        raise UserError(f"unknown audio output {kind!r} (choose auto, device, wav or null)")
    try:
        return DeviceSink(sample_rate, device)
    except AudioDeviceError as e:
        if kind == "device":
            raise
        notice(f"no sound device ({str(e).splitlines()[0]}); writing audio to {wav_path} instead")
        return WavSink(sample_rate, wav_path)
