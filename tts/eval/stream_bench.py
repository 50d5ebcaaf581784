"""`s5 bench tts`: S5, T5 and sentence mode side by side on the same sentences, words fed at a fixed rate into a
real-time player simulation (DESIGN.md section 8)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from audio_io.levels import first_audible_sample
from audio_io.sinks import START_BUFFER_MS
from tts.data.voices import SAMPLE_RATE
from tts.frontend.text import normalize_text
from tts.inference.streaming import (
    DEFAULT_MAX_STRETCH,
    MODES,
    AudioChunk,
    UtteranceTimes,
    join_chunks,
    join_codes,
    synthesize_words,
)
from tts.inference.synthesis import SynthesisConfig, TTSBundle
from tts.paths import CONFIGS

BENCH_SENTENCES = CONFIGS / "bench_sentences.txt"


@dataclass
class Playback:
    """What a listener would hear from chunks played as they arrive: whenever the next chunk is late the player
    runs dry (an underrun) until it arrives."""
    first_audible_ns: int | None
    underruns: int
    underrun_ms: float
    audio_s: float


def simulate_playback(chunks: list[AudioChunk], start_buffer_ms: float = START_BUFFER_MS) -> Playback:
    """Like the players: playback starts once start_buffer_ms of audio is queued (or the last chunk is in), and
    not before the first chunk's play_after_ns (pacing)."""
    audible = [c for c in chunks if len(c.samples)]
    if not audible:
        return Playback(None, 0, 0.0, 0.0)
    rate = audible[0].sample_rate
    queued, start = 0, audible[-1].created_ns
    for chunk in audible:
        queued += len(chunk.samples)
        if queued >= start_buffer_ms / 1000 * rate:
            start = chunk.created_ns
            break
    start = min(max(start, audible[0].play_after_ns or 0), audible[-1].created_ns)  # all in: no reason to wait
    clock, underruns, gap_ns, first_audible, total = start, 0, 0, None, 0
    for chunk in audible:
        if chunk.created_ns > clock:
            underruns += 1
            gap_ns += chunk.created_ns - clock
            clock = chunk.created_ns
        if first_audible is None:
            index = first_audible_sample(chunk.samples, rate)
            if index is not None:
                first_audible = clock + round(index / rate * 1e9)
        clock += round(len(chunk.samples) / rate * 1e9)
        total += len(chunk.samples)
    return Playback(first_audible, underruns, gap_ns / 1e6, total / rate)


@dataclass
class RunRecord:
    mode: str
    text: str
    times: UtteranceTimes
    playback: Playback
    audio: np.ndarray
    codes: torch.Tensor | None

    @property
    def first_chunk_ms(self) -> float | None:
        t = self.times
        if t.first_chunk_ns is None or t.start_allowed_ns is None:
            return None
        return (t.first_chunk_ns - t.start_allowed_ns) / 1e6

    @property
    def first_audible_ms(self) -> float | None:
        if self.playback.first_audible_ns is None:
            return None
        return (self.playback.first_audible_ns - self.times.word_arrivals_ns[0]) / 1e6


def load_sentences(path: Path | None = None) -> list[str]:
    lines = [l.strip() for l in (path or BENCH_SENTENCES).read_text().splitlines()]
    return [l for l in lines if l and not l.startswith("#")]


def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def summarize(records: list[RunRecord]) -> dict:
    first_chunk = [r.first_chunk_ms for r in records if r.first_chunk_ms is not None]
    audible = [r.first_audible_ms for r in records if r.first_audible_ms is not None]
    compute = sum(r.times.compute_ns for r in records) / 1e9
    audio = sum(r.playback.audio_s for r in records)
    return {
        "first_chunk_ms_p50": percentile(first_chunk, 50), "first_chunk_ms_p95": percentile(first_chunk, 95),
        "first_audible_ms_p50": percentile(audible, 50), "first_audible_ms_p95": percentile(audible, 95),
        "rtf": round(compute / audio, 3) if audio else None,
        "underruns": sum(r.playback.underruns for r in records),
        "underrun_ms": round(sum(r.playback.underrun_ms for r in records), 1),
        "frames_per_word": round(sum(r.times.frames for r in records) / max(1, sum(r.times.words for r in records)), 2),
        "paced_ms": round(1000 * sum(r.times.paced_s for r in records), 1),  # audio added by slowing down for text
        "prebuffer_ms_p50": percentile([r.times.prebuffer_ms for r in records], 50),
        "silent_runs": len(records) - len(audible),
        "n": len(records),
    }


async def run_one(bundle: TTSBundle, mode: str, text: str, words_per_second: float, seed: int, emit_every: int | None,
                  max_stretch: float = DEFAULT_MAX_STRETCH) -> RunRecord:
    words = normalize_text(text)
    chunks, times = await synthesize_words(bundle, words, mode, words_per_second, SynthesisConfig(seed=seed), emit_every,
                                           max_stretch=max_stretch)
    return RunRecord(mode, text, times, simulate_playback(chunks), join_chunks(chunks), join_codes(chunks))


async def bench_tts(
    s5: TTSBundle, t5: TTSBundle, sentences: list[str], words_per_second: float = 3.0, emit_every: int | None = None,
    modes: tuple[str, ...] = MODES, quality: bool = True, progress=None, max_stretch: float = DEFAULT_MAX_STRETCH,
) -> dict:
    """Every sentence in every mode, interleaved (s5, t5, sentence, s5, ...) so that machine noise hits all modes
    alike. quality: also synthesise S5 offline (all words known) and compare duration and WER with streaming."""
    records: dict[str, list[RunRecord]] = {m: [] for m in modes}
    offline: list[RunRecord] = []
    task = progress.add_task("bench tts", total=len(sentences)) if progress else None
    for i, text in enumerate(sentences):
        for mode in modes:
            bundle = s5 if mode == "s5" else t5
            records[mode].append(await run_one(bundle, mode, text, words_per_second, i, emit_every, max_stretch))
        if quality and "s5" in modes:
            offline.append(await run_one(s5, "t5", text, 0.0, seed=i, emit_every=emit_every))
        if progress:
            progress.advance(task)
    from tts.inference.streaming import default_emit_every

    result: dict = {"words_per_second": words_per_second, "sentences": len(sentences), "max_stretch": max_stretch,
                    "emit_every": emit_every or default_emit_every(t5.codec.frame_rate)}
    for mode in modes:
        result[mode] = summarize(records[mode])
    if "s5" in modes and "t5" in modes:
        s5_audible, t5_audible = result["s5"]["first_audible_ms_p50"], result["t5"]["first_audible_ms_p50"]
        result["ratio_first_audible_s5_over_t5"] = round(s5_audible / t5_audible, 3) if s5_audible and t5_audible else None
    if offline:
        result["s5_streaming_vs_offline"] = compare_streaming_offline(records["s5"], offline)
    return result


def compare_streaming_offline(streaming: list[RunRecord], offline: list[RunRecord]) -> dict:
    """Durations: the speech the model made (before pacing) and the audio as played (after pacing)."""
    spoken = [(len(s.audio) / SAMPLE_RATE - s.times.paced_s) / max(1e-9, len(o.audio) / SAMPLE_RATE) for s, o in zip(streaming, offline)]
    played = [len(s.audio) / max(1, len(o.audio)) for s, o in zip(streaming, offline)]
    out = {"duration_ratio_min": round(min(spoken), 3), "duration_ratio_max": round(max(spoken), 3),
           "played_duration_ratio_min": round(min(played), 3), "played_duration_ratio_max": round(max(played), 3)}
    try:
        from tts.eval.metrics import error_rates, transcribe
    except ImportError:  # the eval extra is not installed
        return out
    texts = [r.text for r in streaming]
    for name, records in (("streaming", streaming), ("offline", offline)):
        hypotheses = [transcribe(r.audio, SAMPLE_RATE) if len(r.audio) else "" for r in records]
        out[f"wer_{name}"] = round(error_rates(texts, hypotheses)[0], 2)
    out["identical_codes"] = all(s.codes is not None and o.codes is not None and torch.equal(s.codes, o.codes) for s, o in zip(streaming, offline))
    return out
