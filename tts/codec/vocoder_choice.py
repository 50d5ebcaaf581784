"""`auto`: the vocoder a stream is voiced with here, chosen by timing this machine, not by its CPU flags.

The most natural candidate that stays live wins: HiFi-GAN V1 ("universal") if its figures meet the bars, else the
iSTFT vocoder ("fast"). Each candidate renders the chunks a stream makes (the opening chunk, single frames, steady
chunks), through the codec's streaming decoder on one thread (the chat's worker runs on one), while a second thread
keeps the other core busy as the embedded LLM does while a reply is spoken. Timing both takes about 0.3 s once
their weights are loaded. From the figures and a decoder step's cost (measured by the caller on its model, see
`tts/inference/streaming.py`) `judge` estimates the two things a listener meets:

- first sound after word k + 1: the engine's opening (`tts/inference/schedule.py`: decode past what the codec holds
  back, render, then a step and a render at a time until the sound carries `opening_margin` times the next piece
  of work, and at least `min_sound_s`), times `HEADROOM`;
- real-time factor of streaming (decoder steps plus rendering steady chunks), times `HEADROOM`.

The timings are cached per machine, CPU and torch version in the user's cache folder (`cache_path`), so later runs
decide without timing; `--vocoder`, `tts.vocoder` in a config, or a deleted cache file override or redo it.
Nothing here is global: the cache file is the only state, and every function takes what it needs.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

AUTO = "auto"
CANDIDATES = ("universal", "fast")  # most natural first (Distill-MOS in docs/results.md)
FALLBACK = "fast"  # voiced when no candidate meets the bars: it always streams
CODEC_ONLY_STEP_S = 0.010  # a decoder step, for a caller with no model at hand (a codec bench): the shipped
# model's step on a slow 2-core machine; the engine passes its own measured step
STEADY_FRAMES = 8  # codec frames a steady render carries: about a word (0.37 s at 21.5 frames/s)
HEADROOM = 1.5  # the estimates are multiplied by this before the bars: render costs spike beside an LLM (a 2-core
# EPYC with V1 ran dry in some runs while its averages met the bars)


@dataclass(frozen=True)
class ChoiceBars:
    """What a vocoder must hold to be chosen: the chat's promises to a listener."""
    first_sound_ms: float = 150.0  # after word k + 1 arrived
    stream_rtf: float = 0.5  # decoder steps + rendering, per second of audio, beside the LLM


@dataclass(frozen=True)
class OpeningRule:
    """The engine's opening (`tts/inference/schedule.py` reads these, so the estimate follows the engine)."""
    frames_past_holdback: int = 2  # the first render carries this many decoder steps past what the codec holds
    # back (the first frame is mostly the voice's leading silence)
    margin: float = 2.0  # the first chunk lasts this many times the next piece of work (a step and a render); later
    # chunks are rendered before decoding and rendering them would take more than 1/this of the sound ahead
    min_sound_s: float = 0.1  # and at least this long, whatever the estimate: on a shared VM a step can take four
    # times its last one, and first chunks of 0.05 s then ran dry (docs/results.md, Xeon-ICX)


@dataclass
class VocoderTiming:
    """One candidate's render costs on this machine (seconds, one thread, the other core busy)."""
    vocoder: str
    held_back: int  # codec frames its streaming decoder holds back (its right context)
    opening_render_s: float  # the first render of a stream: held_back + frames_past_holdback codec frames
    frame_render_s: float  # a render of one codec frame, mid-stream
    steady_rtf: float  # rendering word-sized chunks (`STEADY_FRAMES`), per second of audio


@dataclass
class Verdict:
    vocoder: str
    first_sound_ms: float  # estimate, headroom included
    stream_rtf: float  # estimate, headroom included
    passes: bool


def cache_path() -> Path:
    """One file per machine, CPU model and torch version, in the user's cache folder."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "s5-agent"
    cpu = _cpu_model().replace(" ", "_").replace("/", "_")[:60]
    return root / f"vocoder_timing-{platform.node()}-{cpu}-torch{torch.__version__}.json"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_cached(path: Path | None = None) -> list[VocoderTiming] | None:
    """This machine's timings, if they were measured (None: not yet, or the file is unreadable)."""
    data = _read(path)
    try:
        return [VocoderTiming(**t) for t in data["timings"]] if data else None
    except (KeyError, TypeError):
        return None


def read_cached_step(path: Path | None = None) -> tuple[list[VocoderTiming], float, float] | None:
    """(timings, decoder step, frame rate) as the engine last chose with them, for `--show-settings`."""
    data, timings = _read(path), read_cached(path)
    if not data or timings is None or data.get("step_s") is None:
        return None
    return timings, float(data["step_s"]), float(data["frame_rate"])


def _read(path: Path | None) -> dict | None:
    try:
        data = json.loads((path or cache_path()).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_cached(timings: list[VocoderTiming], step_s: float | None = None, frame_rate: float | None = None,
                 path: Path | None = None) -> None:
    """Keep the timings (and the decoder step the engine weighed them against) for later runs."""
    path = path or cache_path()
    data = {"timings": [asdict(t) for t in timings], "measured": time.strftime("%Y-%m-%d"),
            "step_s": step_s, "frame_rate": frame_rate}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    except OSError:  # a read-only home: measure again next time
        pass


def judge(timing: VocoderTiming, step_s: float, frame_rate: float, rule: OpeningRule = OpeningRule(),
          bars: ChoiceBars = ChoiceBars()) -> Verdict:
    """The opening as the engine runs it, and the steady real-time factor, from the measured costs."""
    frame_s = 1.0 / frame_rate
    first = timing.held_back + rule.frames_past_holdback
    elapsed = first * step_s + timing.opening_render_s
    sound = rule.frames_past_holdback * frame_s
    enough = max(rule.min_sound_s, rule.margin * (step_s + timing.frame_render_s))
    while sound < enough:
        elapsed += step_s + timing.frame_render_s
        sound += frame_s
    first_sound_ms = HEADROOM * elapsed * 1000
    stream_rtf = HEADROOM * (step_s * frame_rate + timing.steady_rtf)
    passes = first_sound_ms <= bars.first_sound_ms and stream_rtf <= bars.stream_rtf
    return Verdict(timing.vocoder, round(first_sound_ms, 1), round(stream_rtf, 3), passes)


def choose(timings: list[VocoderTiming], step_s: float, frame_rate: float, rule: OpeningRule = OpeningRule(),
           bars: ChoiceBars = ChoiceBars()) -> tuple[str, list[Verdict]]:
    """The first candidate (most natural first) whose verdict passes, else `FALLBACK`; and every verdict."""
    verdicts = [judge(t, step_s, frame_rate, rule, bars) for t in timings]
    chosen = next((v.vocoder for v in verdicts if v.passes), FALLBACK)
    return chosen, verdicts


def describe(chosen: str, verdicts: list[Verdict], bars: ChoiceBars = ChoiceBars()) -> str:
    """One line: what auto chose here and the figures it chose by."""
    parts = [f"{v.vocoder}: first sound {v.first_sound_ms:.0f} ms, stream {v.stream_rtf:.2f}x RT "
             f"({'meets' if v.passes else 'misses'} the bars)" for v in verdicts]
    return (f"{chosen}; {'; '.join(parts)}; bars <= {bars.first_sound_ms:.0f} ms and <= {bars.stream_rtf}x, "
            f"estimates x{HEADROOM}")


def named_warning(name: str, path: Path | None = None) -> str | None:
    """A vocoder named by the user (`--vocoder`, the config) that this machine's timings say misses the bars: one
    line saying what it will sound like and what `auto` picks here (None: it meets them, or nothing was timed)."""
    cached = read_cached_step(path)
    if cached is None or name not in CANDIDATES:
        return None
    timings, step_s, frame_rate = cached
    chosen, verdicts = choose(timings, step_s, frame_rate)
    verdict = next((v for v in verdicts if v.vocoder == name), None)
    if verdict is None or verdict.passes:
        return None
    return (f"vocoder {name}: timed on this machine at first sound {verdict.first_sound_ms:.0f} ms, stream "
            f"{verdict.stream_rtf:.2f}x real time (with headroom), past what plays without gaps; expect stutter "
            f"(`auto` picks {chosen} here)")


class BusyNeighbour:
    """Another process spinning on one core while the timings run, as an LLM beside the voice keeps a core busy.
    A process, not a thread: a Python thread would contend for the interpreter lock at every tensor operation,
    which an LLM running in native code does not."""

    def __enter__(self) -> "BusyNeighbour":
        self._process = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc) -> None:
        self._process.kill()
        self._process.wait()


def time_renders(name: str, new_stream: Callable[[], object], num_codebooks: int, frame_rate: float, held_back: int,
                 rule: OpeningRule = OpeningRule(), clock: Callable[[], float] = time.perf_counter) -> VocoderTiming:
    """Render what a stream renders, through `new_stream()` (a codec streaming decoder voiced by the candidate):
    the opening chunk of `first` frames, single frames, word-sized chunks; the median of a few tries of each (the
    first stream is left out: the engine warms those shapes up at load)."""
    first = held_back + rule.frames_past_holdback

    def timed(stream, n: int) -> float:
        codes = torch.zeros(num_codebooks, n, dtype=torch.long)
        started = clock()
        stream.push(codes)
        return clock() - started

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode(), BusyNeighbour():
            opening, single, steady = [], [], []
            for attempt in range(4):
                stream = new_stream()
                tries = [timed(stream, first), timed(stream, 1), timed(stream, 1), timed(stream, STEADY_FRAMES)]
                if attempt:  # the first stream's calls pay for allocations the engine makes at load
                    opening.append(tries[0])
                    single += tries[1:3]
                    steady.append(tries[3])
    finally:
        torch.set_num_threads(threads)
    return VocoderTiming(name, held_back, float(np.median(opening)), float(np.median(single)),
                         float(np.median(steady)) * frame_rate / STEADY_FRAMES)
