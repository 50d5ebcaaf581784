"""The parts of a streaming utterance besides its schedule (`tts/inference/schedule.py`): the synthesis-unit rule,
the inbox the driver fills with words, the timing record, the chunk that leaves, the pacer and the trim of the
leading silence. All per utterance; no thread of their own (the inbox is safe to fill from another).

Where a synthesis unit ends is decided once, as a word enters the inbox (`Inbox.put_word` -> `UnitCutter`): the
driver reads it to stamp when synthesis may start, the schedule's policies to open and close units."""
from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from audio_io.levels import AUDIBLE_DBFS, WINDOW_S, audible_onset
from tts.inference.tuning import TUNING, StreamTuning

MODES = ("s5", "t5", "sentence")
SEGMENT_BREAK = "\u2029"  # in a word stream: the text pauses here (`push_break`), e.g. where a skipped code block opens
SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")
CLAUSE_END = re.compile(r"[,;:\u2014\u2013][\"')\]]*$")


def ends_unit(words_in_unit: int, word: str, tuning: StreamTuning = TUNING) -> bool:
    """Does a synthesis unit end after `word`, its `words_in_unit`-th word? At a sentence end; at a clause end
    once the unit is long; at `max_unit_words` whatever the word."""
    return (bool(SENTENCE_END.search(word)) or words_in_unit >= tuning.max_unit_words
            or (words_in_unit >= tuning.clause_unit_words and bool(CLAUSE_END.search(word))))


class UnitCutter:
    """Counts the words of the unit being filled and says where it ends (a `SEGMENT_BREAK` ends it too)."""

    def __init__(self, tuning: StreamTuning = TUNING):
        self.tuning = tuning
        self.words = 0

    def cut(self, word: str) -> bool:
        """Does the unit end after this word (or break)?"""
        if word == SEGMENT_BREAK:
            self.words = 0
            return True
        self.words += 1
        if ends_unit(self.words, word, self.tuning):
            self.words = 0
            return True
        return False


def split_units(words: list[str]) -> list[list[str]]:
    """Words known in advance -> the units a stream of them is cut into."""
    cutter, units = UnitCutter(), [[]]
    for word in words:
        units[-1].append(word)
        if cutter.cut(word):
            units.append([])
    return [u for u in units if u]


DEFAULT_MAX_STRETCH = TUNING.max_stretch  # the pacing limit a caller gets unless it says otherwise


def mean_interval_ns(times_ns: list[int]) -> int | None:
    """The mean time between successive stamps (None for fewer than two)."""
    return round((times_ns[-1] - times_ns[0]) / (len(times_ns) - 1)) if len(times_ns) >= 2 else None


@dataclass(frozen=True)
class WordTime:
    """Where a spoken word sits in its utterance's audio: seconds from the first sample sent."""
    word: str
    start_s: float
    end_s: float

    def to_json(self) -> dict:
        return {"word": self.word, "start_s": round(self.start_s, 3), "end_s": round(self.end_s, 3)}


class WordTimeline:
    """Per utterance: each word's place in the audio, from the schedule's own alignment. The decoder gives every
    frame to one word (a word ends where its cross-attention moves on), so a word spans the frames between its
    first and the next word's first; each render says how many samples its frames became (pacing stretches
    them), and the leading silence dropped before the first sound shifts everything back."""

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate
        self.frames_assigned = 0  # frames of the words completed so far
        self._renders: list[tuple[int, int, int, int]] = []  # (first frame, frames, first sample, samples)
        self.frames_rendered = 0
        self._samples_rendered = 0
        self.dropped = 0  # leading samples not sent (`LeadingSilence`)

    def rendered(self, frames: int, samples: int) -> None:
        """A render turned the next `frames` frames into `samples` samples of the stream (before the trim)."""
        self._renders.append((self.frames_rendered, frames, self._samples_rendered, samples))
        self.frames_rendered += frames
        self._samples_rendered += samples

    def word_done(self, word: str, frames: int) -> tuple[int, int]:
        """A word completed with `frames` frames: its frame span."""
        span = (self.frames_assigned, self.frames_assigned + frames)
        self.frames_assigned += frames
        return span

    def seconds(self, frame: int) -> float | None:
        """Where frame boundary `frame` falls in the sent audio (None: not rendered yet)."""
        for first, frames, first_sample, samples in self._renders:
            if first <= frame <= first + frames and frames:
                sample = first_sample + samples * (frame - first) / frames
                return max(0.0, (sample - self.dropped) / self.sample_rate)
        return None

    def time(self, word: str, span: tuple[int, int]) -> WordTime | None:
        start, end = self.seconds(span[0]), self.seconds(span[1])
        return None if start is None or end is None else WordTime(word, start, end)


@dataclass
class AudioChunk:
    samples: np.ndarray  # float32 mono
    sample_rate: int
    created_ns: int  # time.perf_counter_ns() when the chunk became playable
    frames: int  # codec frames it carries (0 for a tail with no frames of its own)
    codes: torch.Tensor | None = None  # (K, frames) the codes rendered into it
    play_after_ns: int | None = None  # pacing: a player should not start the utterance before this time
    words: tuple[str, ...] = ()  # the words completed since the previous chunk (to trace a gap to its text)
    word_times: tuple[WordTime, ...] = ()  # words whose start this chunk is the first to carry, placed in the audio


@dataclass
class UtteranceTimes:
    """What one utterance's synthesis did, and when (monotonic perf_counter_ns), each field written once by the
    part that sees it happen: the inbox (words in), the schedule (frames, compute, pacing), the driver (chunks
    out). A turn's record (`agent/records.py`) and the benchmarks read it; nothing copies it."""
    word_arrivals_ns: list[int] = field(default_factory=list)
    end_ns: int | None = None
    start_allowed_ns: int | None = None  # s5: word k+1 arrived (or the end); t5: end; sentence: first sentence in
    first_codec_frame_ns: int | None = None
    first_render_asked_ns: int | None = None  # the first sound's frames went to be rendered
    first_render_done_ns: int | None = None  # and came back as audio
    first_chunk_ns: int | None = None  # the first chunk with audio left the engine
    last_chunk_ns: int | None = None
    audio_s: float = 0.0  # audio sent so far
    chunk_words: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)  # (starts at audio second, words)
    compute_ns: int = 0  # worker time spent decoding and rendering
    frames: int = 0
    paced_s: float = 0.0  # audio seconds added by pacing (stretching while waiting for text)
    prebuffer_ms: float = 0.0  # pacing: how long the player was asked to hold the first chunk
    opening_hold_ms: float = 0.0  # how long a short opening word waited for the next word's text
    words: int = 0  # words completed (decoded)
    capped_words: int = 0
    word_times: list[WordTime] = field(default_factory=list)  # every spoken word's final place in the audio
    words_started: list[WordTime] = field(default_factory=list)  # the words sent so far, as chunks announced them

    @property
    def first_word_ns(self) -> int | None:
        return self.word_arrivals_ns[0] if self.word_arrivals_ns else None

    @property
    def spoken_words(self) -> int:
        """Words given to the engine to speak."""
        return len(self.word_arrivals_ns)

    def sent(self, chunk: "AudioChunk") -> None:
        """The driver sent `chunk` on (in order)."""
        if self.first_chunk_ns is None and len(chunk.samples):
            self.first_chunk_ns = chunk.created_ns
        self.last_chunk_ns = chunk.created_ns
        if len(chunk.samples) or chunk.words:
            self.chunk_words.append((self.audio_s, chunk.words))
        self.words_started += chunk.word_times
        self.audio_s += len(chunk.samples) / chunk.sample_rate

    def words_heard(self, played_s: float) -> int:
        """How many words had begun to sound once `played_s` seconds of the audio had played."""
        return sum(1 for word in self.words_started if word.start_s < played_s)

    def words_around(self, at_s: float) -> tuple[str, str]:
        """The words completed just before audio second `at_s` (where a gap fell) and the next word completed
        after it (a chunk sent mid-word names no word: the word it starts is completed by a later chunk)."""
        before = [w for start, w in self.chunk_words if start < at_s - 1e-6 and w]
        after = [w for start, w in self.chunk_words if start >= at_s - 1e-6 and w]
        return " ".join(before[-1] if before else ()), " ".join(after[0] if after else ())


class Pacer:
    """Per utterance: keeps a virtual player's clock (when the audio emitted so far will have played out) and
    picks a stretch for each new chunk so that it lasts until the engine can emit again."""

    def __init__(self, max_stretch: float = DEFAULT_MAX_STRETCH, margin_s: float = TUNING.pacing_margin_s):
        self.max_stretch = max(1.0, max_stretch)
        self.margin_ns = round(margin_s * 1e9)  # reserve: the next word's compute, jitter, a short word next
        self.play_end_ns: int | None = None

    @staticmethod
    def paces(text_interval_ns: int | None) -> bool:
        """Is text arriving one word every text_interval_ns slow enough to pace (slower than 5 words/s)?"""
        return text_interval_ns is not None and text_interval_ns > TUNING.slow_text_s * 1e9

    @staticmethod
    def pace_interval_ns(word_interval_ns: int | None, token_interval_ns: int | None = None) -> int | None:
        """The text's pace per word: the time between words, or `slow_word_tokens` tokens' time where longer."""
        if word_interval_ns is None or not token_interval_ns:
            return word_interval_ns
        return max(word_interval_ns, TUNING.slow_word_tokens * token_interval_ns)

    @staticmethod
    def prebuffer_ns(word_interval_ns: int | None, token_interval_ns: int | None = None) -> int:
        """How long the player should hold the first chunk for paced text: three words' time, or
        `prebuffer_tokens` of a slow LLM's tokens where that is longer."""
        if not Pacer.paces(Pacer.pace_interval_ns(word_interval_ns, token_interval_ns)):
            return 0
        hold = max(TUNING.prebuffer_words * word_interval_ns, TUNING.prebuffer_tokens * (token_interval_ns or 0))
        return round(min(TUNING.max_prebuffer_s * 1e9, hold))

    def stretch(self, now_ns: int, chunk_s: float, wait_ns: int | None) -> float:
        """chunk_s: the new chunk's duration unstretched; wait_ns: how long until the words the engine needs next
        arrive (None: it can go on at once). Returns the factor (1 .. max_stretch) to render the chunk with."""
        buffered_ns = max(0, self.play_end_ns - now_ns) if self.play_end_ns is not None else 0
        factor = 1.0
        if wait_ns is not None and chunk_s > 0:
            needed_s = (wait_ns + self.margin_ns - buffered_ns) / 1e9
            factor = min(self.max_stretch, max(1.0, needed_s / chunk_s))
        self.play_end_ns = max(self.play_end_ns or now_ns, now_ns) + round(chunk_s * factor * 1e9)
        return factor


class LeadingSilence:
    """Per utterance: drops the silence a reply starts with (the voice's first frame is mostly quiet: 20-50 ms the
    listener would wait for). The sound starts at the first 10 ms window that is audible (1 dB above the players'
    threshold, wherever it starts), its first millisecond faded in so that nothing clicks."""

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate
        self.window = round(WINDOW_S * sample_rate)
        self.fade = round(TUNING.fade_in_s * sample_rate)
        self.held = np.zeros(0, np.float32)
        self.done = False
        self.dropped = 0  # samples dropped before the first sound

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        if self.done:
            return audio
        held = np.concatenate([self.held, audio])
        onset = audible_onset(held, self.sample_rate, AUDIBLE_DBFS + 1.0)
        if onset is None:  # all quiet so far: keep what a window starting here would need
            keep = held[max(0, len(held) - self.window + 1) :]
            self.dropped += len(held) - len(keep)
            self.held = keep
            return np.zeros(0, np.float32)
        self.dropped += onset
        self.done, self.held = True, np.zeros(0, np.float32)
        out = held[onset:].copy()
        out[: self.fade] *= np.linspace(0.0, 1.0, self.fade, endpoint=False, dtype=np.float32)[: len(out)]
        return out


class Inbox:
    """The words and token stamps the driver received and the schedule has not taken yet, each word with whether
    it ends a synthesis unit. Thread-safe: the event loop writes (`put_word`, `put_token`, `end`, and `closed` on a
    cancel), the schedule reads on its worker thread; `ended` and `closed` only ever go from False to True."""

    def __init__(self, times: UtteranceTimes, clock: Callable[[], int] = time.perf_counter_ns,
                 tuning: StreamTuning = TUNING):
        self.times = times
        self.clock = clock
        self._lock = threading.Lock()
        self._words: deque[tuple[str, bool]] = deque()  # (word or SEGMENT_BREAK, ends its unit)
        self._cutter = UnitCutter(tuning)
        self._token_arrivals_ns: deque[int] = deque(maxlen=8)  # the LLM's last tokens, when the caller notes them
        self.ended = False
        self.closed = False  # cancelled: the schedule stops at its next unit

    def put_word(self, word: str) -> tuple[int, bool]:
        """(arrival time, whether the word ends its synthesis unit)."""
        now = self.clock()
        with self._lock:
            ends = self._cutter.cut(word)
            self._words.append((word, ends))
            if word != SEGMENT_BREAK:
                self.times.word_arrivals_ns.append(now)
        return now, ends

    def put_token(self, t_ns: int) -> None:
        with self._lock:
            self._token_arrivals_ns.append(t_ns)

    def end(self) -> None:
        self.ended = True

    def take(self) -> tuple[list[tuple[str, bool]], bool]:
        """Everything waiting as (word, ends its unit), and whether the text has ended (read together)."""
        with self._lock:
            words = list(self._words)
            self._words.clear()
            return words, self.ended

    def waiting(self) -> tuple[int, bool]:
        """Words waiting (not taken yet), and whether the text has ended."""
        with self._lock:
            return len(self._words), self.ended

    def clear(self) -> None:
        with self._lock:
            self._words.clear()

    def last_arrival_ns(self) -> int:
        with self._lock:
            return self.times.word_arrivals_ns[-1]

    def word_interval_ns(self) -> int | None:
        """The recent time between words (None before two words arrived)."""
        with self._lock:
            return mean_interval_ns(self.times.word_arrivals_ns[-5:])

    def token_interval_ns(self) -> int | None:
        """The recent time between the LLM's tokens (None unless the caller notes them)."""
        with self._lock:
            return mean_interval_ns(list(self._token_arrivals_ns))
