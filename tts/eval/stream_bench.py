"""`s5 bench tts`: S5, T5 and sentence mode side by side on the same sentences, words fed at a fixed rate into a
real-time player simulation (`docs/architecture.md`, section 8)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tts.data.voices import SAMPLE_RATE
from tts.frontend.text import normalize_text
from tts.inference.pipeline import SpeechResult, speak
from tts.inference.streaming import DEFAULT_MAX_STRETCH, MODES
from tts.inference.synthesis import SynthesisConfig, TTSBundle
from tts.paths import CONFIGS

BENCH_SENTENCES = CONFIGS / "bench_sentences.txt"


@dataclass
class RunRecord:
    mode: str
    text: str
    speech: SpeechResult  # played into an unpaced clock sink: the player model `s5 chat` uses


def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


def summarize(records: list[RunRecord]) -> dict:
    speech = [r.speech for r in records]
    first_chunk = [s.first_chunk_ms for s in speech if s.first_chunk_ms is not None]
    audible = [s.first_audible_ms for s in speech if s.first_audible_ms is not None]
    compute = sum(s.times.compute_ns for s in speech) / 1e9
    audio = sum(s.audio_s for s in speech)
    return {
        "first_chunk_ms_p50": percentile(first_chunk, 50), "first_chunk_ms_p95": percentile(first_chunk, 95),
        "first_audible_ms_p50": percentile(audible, 50), "first_audible_ms_p95": percentile(audible, 95),
        "rtf": round(compute / audio, 3) if audio else None,
        "underruns": sum(s.playback.underruns for s in speech),
        "underrun_ms": round(sum(s.playback.underrun_ms for s in speech), 1),
        "frames_per_word": round(sum(s.times.frames for s in speech) / max(1, sum(s.times.words for s in speech)), 2),
        "paced_ms": round(1000 * sum(s.times.paced_s for s in speech), 1),  # audio added by slowing down for text
        "prebuffer_ms_p50": percentile([s.times.prebuffer_ms for s in speech], 50),
        "silent_runs": len(records) - len(audible),
        "n": len(records),
    }


async def run_one(bundle: TTSBundle, mode: str, text: str, words_per_second: float, seed: int, emit_every: int | None,
                  max_stretch: float = DEFAULT_MAX_STRETCH) -> RunRecord:
    speech = await speak(bundle, normalize_text(text), mode, words_per_second, SynthesisConfig(seed=seed),
                         emit_every=emit_every, max_stretch=max_stretch)
    return RunRecord(mode, text, speech)


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
    texts = [r.text for r in streaming]
    streamed, offline_speech = [r.speech for r in streaming], [r.speech for r in offline]
    pairs = list(zip(streamed, offline_speech))
    spoken = [(s.audio_s - s.times.paced_s) / max(1e-9, o.audio_s) for s, o in pairs]
    played = [s.audio_s / max(1e-9, o.audio_s) for s, o in pairs]
    out = {"duration_ratio_min": round(min(spoken), 3), "duration_ratio_max": round(max(spoken), 3),
           "played_duration_ratio_min": round(min(played), 3), "played_duration_ratio_max": round(max(played), 3)}
    try:
        from tts.eval.metrics import error_rates, transcribe
    except ImportError:  # the eval extra is not installed
        return out
    for name, speech in (("streaming", streamed), ("offline", offline_speech)):
        hypotheses = [transcribe(s.audio, SAMPLE_RATE) if s.audio_s else "" for s in speech]
        out[f"wer_{name}"] = round(error_rates(texts, hypotheses)[0], 2)
    out["identical_codes"] = all(s.codes is not None and o.codes is not None and torch.equal(s.codes, o.codes) for s, o in pairs)
    return out
