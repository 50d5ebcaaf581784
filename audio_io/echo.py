"""Telling the user's voice from the agent's own in the microphone (full-duplex listening with loudspeakers).

The player records how loud it played, when (`PlaybackLevels`, fed by every sink). While the agent speaks, a
microphone block can only be the user if it is louder than anything the player put out around that time by
`margin_db`: the echo of the loudspeaker in the microphone is never louder than the played signal itself plus the
room's coupling, and the margin covers that coupling. `coupling_db` 0 assumes the worst case, a microphone that
hears the output at full level (a digital loopback); a headset or a far loudspeaker can set it lower (say -20).
No echo cancellation: the user barges in by speaking clearly louder than the echo, as people do in a room.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

SILENT_DBFS = -100.0
LEVEL_WINDOW_S = 0.010


def level_dbfs(samples: np.ndarray) -> float:
    """RMS level of a block in dB relative to full scale (1.0)."""
    return float(window_levels_dbfs(samples, len(samples))[0]) if len(samples) else SILENT_DBFS


def window_levels_dbfs(samples: np.ndarray, window: int) -> np.ndarray:
    """The RMS level (`level_dbfs`) of each `window` samples in turn (the last window may be shorter), in a few array
    operations: a player levels every 10 ms it plays, and a server's benchmark plays for many clients in one process."""
    n = len(samples)
    if not n:
        return np.zeros(0)
    squares = np.square(samples, dtype=np.float64)
    whole = n // window * window
    means = squares[:whole].reshape(-1, window).mean(axis=1)
    if whole < n:
        means = np.append(means, squares[whole:].mean())
    with np.errstate(divide="ignore"):
        levels = 10 * np.log10(means)  # 20 log10(rms) = 10 log10(mean square)
    return np.maximum(levels, SILENT_DBFS)


class PlaybackLevels:
    """What a sink played: (time the window plays, dBFS) for every 10 ms, the last `keep_s` seconds. Written from
    the player (a callback thread for the sound card), read from the event loop."""

    def __init__(self, keep_s: float = 10.0):
        self._windows: deque[tuple[int, float]] = deque(maxlen=round(keep_s / LEVEL_WINDOW_S))
        self._lock = threading.Lock()

    def add(self, starts_ns: int, samples: np.ndarray, sample_rate: int) -> None:
        window = max(1, round(LEVEL_WINDOW_S * sample_rate))
        levels = window_levels_dbfs(samples, window)
        with self._lock:
            self._windows.extend((starts_ns + round(i * window / sample_rate * 1e9), float(db)) for i, db in enumerate(levels))

    def forget_after(self, t_ns: int) -> None:
        """A flush dropped what was to play after t_ns: it never reached the loudspeaker."""
        with self._lock:
            while self._windows and self._windows[-1][0] > t_ns:
                self._windows.pop()

    def loudest(self, start_ns: int, end_ns: int) -> float:
        """The loudest 10 ms window that played between start_ns and end_ns (SILENT_DBFS if none)."""
        loudest = SILENT_DBFS
        with self._lock:
            for t, db in reversed(self._windows):  # newest first: stop once the windows are older than start_ns
                if t < start_ns:
                    break
                if t <= end_ns and db > loudest:
                    loudest = db
        return loudest


@dataclass
class EchoGate:
    levels: PlaybackLevels
    coupling_db: float = 0.0  # how loud the loudspeaker reaches the microphone, relative to the played signal
    margin_db: float = 6.0  # how much louder than the echo the user must be
    delay_ms: float = 250.0  # the longest echo path (output buffer + room + input buffer)
    playing_dbfs: float = -50.0  # the player is "speaking" when it played louder than this

    def window(self, captured_ns: int, block_s: float) -> tuple[int, int]:
        return captured_ns - round(self.delay_ms * 1e6), captured_ns + round(block_s * 1e9)

    def agent_speaking(self, captured_ns: int, block_s: float) -> bool:
        """Could the agent's voice be in this microphone block?"""
        return self.levels.loudest(*self.window(captured_ns, block_s)) > self.playing_dbfs

    def louder_than_echo(self, block: np.ndarray, captured_ns: int, block_s: float) -> bool:
        """Is this block too loud to be only the agent's own voice coming back?"""
        echo = self.levels.loudest(*self.window(captured_ns, block_s)) + self.coupling_db
        return level_dbfs(block) > echo + self.margin_db
