"""`s5 eval`: synthesise sentences word by word (streaming), transcribe them, and compare with a reference voice."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from audio_io.errors import UserError
from tts.data.corpus import read_manifest
from tts.data.voices import SAMPLE_RATE, VOICES
from tts.eval.metrics import distillmos, dnsmos, error_rates, speaker_similarity, transcribe
from tts.frontend.text import normalize_text
from tts.inference.pipeline import speak
from tts.inference.synthesis import SynthesisConfig, TTSBundle, VoicePrompt


@dataclass
class EvalResult:
    text: str
    audio: np.ndarray
    seconds: float  # synthesis wall time
    chunks: int
    capped_words: int


def synthesize_streaming(bundle: TTSBundle, text: str, config: SynthesisConfig, prompt: VoicePrompt | None = None,
                         mode: str | None = None) -> EvalResult:
    """The text through the pipeline `s5 chat` runs (word by word for an S5 model, the whole text for a
    full-context one, unless `mode` says otherwise), into the same player model; the audio is what it played."""
    mode = mode or ("s5" if bundle.model.config.lookahead_words is not None else "t5")
    start = time.perf_counter()
    speech = asyncio.run(speak(bundle, normalize_text(text), mode, config=config, prompt=prompt, max_stretch=1.0))
    return EvalResult(text, speech.audio, time.perf_counter() - start, len(speech.chunks), speech.times.capped_words)


def reference_voice_named(name: str):
    """One of the offline voices, to speak the same text beside the TTS (a one-line error for an unknown name)."""
    if name not in VOICES:
        raise UserError(f"unknown reference voice {name!r} (known: {', '.join(VOICES)})")
    return VOICES[name]


def evaluate(
    bundle: TTSBundle, sentences: list[str], reference_voice: str = "piper_joe", seed: int = 0,
    speaker_clip: np.ndarray | None = None, out_dir: Path | None = None, progress=None,
    prompt: VoicePrompt | None = None, cfg_scale: float = SynthesisConfig.cfg_scale, mode: str | None = None,
) -> dict:
    if not sentences:
        raise UserError("no sentences to evaluate")
    mode = mode or ("s5" if bundle.model.config.lookahead_words is not None else "t5")
    reference = reference_voice_named(reference_voice)
    task = progress.add_task("eval", total=len(sentences)) if progress else None
    hyps, ref_hyps, sims, moses, distill, ratios = [], [], [], [], [], []
    synth_seconds = audio_seconds = 0.0
    for i, text in enumerate(sentences):
        result = synthesize_streaming(bundle, text, SynthesisConfig(seed=seed + i, cfg_scale=cfg_scale), prompt, mode)
        ref_audio = reference.synthesize(text).audio
        hyps.append(transcribe(result.audio, SAMPLE_RATE) if len(result.audio) else "")
        ref_hyps.append(transcribe(ref_audio, SAMPLE_RATE))
        target = speaker_clip if speaker_clip is not None else ref_audio
        sims.append(speaker_similarity(result.audio, target, SAMPLE_RATE) if len(result.audio) > SAMPLE_RATE // 2 else 0.0)
        moses.append(dnsmos(result.audio, SAMPLE_RATE) if len(result.audio) > SAMPLE_RATE // 2 else 1.0)
        distill.append(distillmos(result.audio, SAMPLE_RATE) if len(result.audio) > SAMPLE_RATE // 2 else 1.0)
        ratios.append(len(result.audio) / max(1, len(ref_audio)))
        synth_seconds += result.seconds
        audio_seconds += len(result.audio) / SAMPLE_RATE
        if out_dir is not None:
            from audio_io.wav import write_wav

            out_dir.mkdir(parents=True, exist_ok=True)
            write_wav(out_dir / f"{i:03d}.wav", result.audio)
        if progress:
            progress.advance(task)
    wer, cer = error_rates(sentences, hyps)
    wer_ref, _ = error_rates(sentences, ref_hyps)
    return {
        "wer": round(wer, 2), "cer": round(cer, 2), "wer_reference": round(wer_ref, 2),
        "speaker_similarity": round(float(np.mean(sims)), 3), "dnsmos": round(float(np.mean(moses)), 3),
        "distillmos": round(float(np.mean(distill)), 3),
        "rtf": round(synth_seconds / max(audio_seconds, 1e-6), 3),
        "duration_ratio": round(float(np.mean(ratios)), 3),
        "duration_ratio_min": round(float(np.min(ratios)), 3), "duration_ratio_max": round(float(np.max(ratios)), 3),
        "duration_ratio_in_range": round(float(np.mean([(0.6 <= r <= 1.6) for r in ratios])), 3),
        "n": len(sentences), "mode": mode,
        "cfg_scale": cfg_scale if bundle.model.null_memory is not None else None,
        "threads": torch.get_num_threads(),
    }


class RssWatch:
    """The process's resident memory (MB) when the block starts, its peak while it runs (sampled every 50 ms on a
    thread) and when it ends: what synthesis itself holds, apart from the judges run after it."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.start_mb = self.peak_mb = self.end_mb = 0

    @staticmethod
    def rss_mb() -> int:
        with open("/proc/self/statm") as f:
            return round(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20)

    def __enter__(self) -> "RssWatch":
        self.start_mb = self.peak_mb = self.rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_mb = max(self.peak_mb, self.rss_mb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.end_mb = self.rss_mb()
        self.peak_mb = max(self.peak_mb, self.end_mb)


def evaluate_long(bundle: TTSBundle, replies: list[str], mode: str, reference_voice: str = "piper_joe", seed: int = 0,
                  out_dir: Path | None = None, progress=None) -> dict:
    """Long replies, each spoken as one turn (the engine cuts it into synthesis units), judged over the whole audio
    against the reference voice speaking the same text: Whisper WER, seconds of audio per word, the longest pause
    inside the speech, Distill-MOS; synthesis rtf and the process's memory while it synthesises."""
    from audio_io.levels import longest_silence_s

    if not replies:
        raise UserError("no replies to evaluate")
    reference = reference_voice_named(reference_voice)
    task = progress.add_task("long replies", total=len(replies)) if progress else None
    rows = []
    for i, text in enumerate(replies):
        words = len(normalize_text(text))
        with RssWatch() as memory:
            result = synthesize_streaming(bundle, text, SynthesisConfig(seed=seed + i), mode=mode)
        ref_audio = reference.synthesize(text).audio
        audio_s, ref_s = len(result.audio) / SAMPLE_RATE, len(ref_audio) / SAMPLE_RATE
        rows.append({
            "words": words,
            "wer": round(error_rates([text], [transcribe(result.audio, SAMPLE_RATE)])[0], 2),
            "wer_reference": round(error_rates([text], [transcribe(ref_audio, SAMPLE_RATE)])[0], 2),
            "s_per_word": round(audio_s / words, 3), "s_per_word_reference": round(ref_s / words, 3),
            "longest_pause_s": round(longest_silence_s(result.audio, SAMPLE_RATE), 2),
            "longest_pause_s_reference": round(longest_silence_s(ref_audio, SAMPLE_RATE), 2),
            "distillmos": round(distillmos(result.audio, SAMPLE_RATE), 3),
            "capped_words": result.capped_words,
            "rtf": round(result.seconds / max(audio_s, 1e-6), 3),
            "rss_start_mb": memory.start_mb, "rss_peak_mb": memory.peak_mb, "rss_end_mb": memory.end_mb,
        })
        if out_dir is not None:
            from audio_io.wav import write_wav

            out_dir.mkdir(parents=True, exist_ok=True)
            write_wav(out_dir / f"long_{i:02d}.wav", result.audio)
            write_wav(out_dir / f"long_{i:02d}_reference.wav", ref_audio)
        if progress:
            progress.advance(task)
    summary = {key: round(float(np.mean([r[key] for r in rows])), 3) for key in rows[0] if not key.startswith("rss")}
    summary["rss_growth_mb"] = max(r["rss_peak_mb"] - r["rss_start_mb"] for r in rows)
    summary["wer_ratio"] = round(summary["wer"] / max(summary["wer_reference"], 1e-6), 2)
    summary["s_per_word_ratio"] = round(summary["s_per_word"] / summary["s_per_word_reference"], 3)
    summary["longest_pause_s_max"] = max(r["longest_pause_s"] for r in rows)
    return {**summary, "mode": mode, "n": len(rows), "replies": rows}


def heldout_sentences(corpus: Path, speaker: str = "piper_joe", limit: int = 30) -> list[str]:
    """Sentences of the test split (never seen in training), in a stable order: from the corpus manifest, or,
    without a corpus, from the shipped tokenised test split."""
    if (corpus / "test.jsonl").exists():
        entries = [e for e in read_manifest(corpus / "test.jsonl") if e.speaker == speaker] or read_manifest(corpus / "test.jsonl")
        return sorted({e.text for e in entries})[:limit]
    from tts.data.tokens import load_tokenized
    from tts.paths import DEFAULT_TOKENS, repo_path

    shipped = load_tokenized(repo_path(DEFAULT_TOKENS), "test")
    if not shipped:
        raise UserError(f"no test split: neither {corpus}/test.jsonl nor shipped test tokens")
    return sorted({u.text for u in shipped if u.speaker == speaker} or {u.text for u in shipped})[:limit]


ZERO_SHOT_VOICE = "flite_rms"  # held out of training entirely (DESIGN: zero-shot evaluation)
ZERO_SHOT_PROMPT_TEXT = "The quick brown fox jumps over the lazy dog near the river bank."


def zero_shot_prompt(bundle: TTSBundle, voice: str = ZERO_SHOT_VOICE) -> tuple[VoicePrompt, np.ndarray]:
    """A clip of a held-out speaker (synthesised offline by its voice) as the prompt, and the clip itself."""
    clip = VOICES[voice].synthesize(ZERO_SHOT_PROMPT_TEXT).audio
    return VoicePrompt.from_audio(bundle, ZERO_SHOT_PROMPT_TEXT, clip), clip
