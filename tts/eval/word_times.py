"""How well S5's own word times (`stream_parts.WordTimeline`: the schedule's alignment) place each word in its
audio, judged by Whisper tiny.en's word timestamps on unseen sentences (`s5 bench words`).

The judge errs too. Its floor is measured the same way on speech whose word starts are known exactly: the Piper
voice speaking the same sentences, with its phoneme alignment (a word starts where the space or sentence-start
entry before it ends). Both figures come from one run, side by side; `docs/results.md` has them.
"""
from __future__ import annotations

import asyncio
import difflib
import re

import numpy as np

from audio_io.asr import ASR_RATE, whisper_model
from audio_io.wav import resample
from tts.frontend.text import normalize_text
from tts.inference.pipeline import speak
from tts.inference.synthesis import SynthesisConfig, TTSBundle


def _norm(word: str) -> str:
    return re.sub(r"[^a-z0-9']", "", word.lower())


def whisper_word_starts(audio: np.ndarray, rate: int) -> list[tuple[str, float]]:
    """(word, start seconds) as Whisper tiny.en hears them (greedy, word timestamps)."""
    x = np.clip(resample(np.asarray(audio, dtype=np.float32), rate, ASR_RATE), -1, 1)
    segments, _ = whisper_model().transcribe(x, language="en", beam_size=1, temperature=0.0, word_timestamps=True,
                                             condition_on_previous_text=False, vad_filter=False)
    return [(w.word.strip(), float(w.start)) for segment in segments for w in (segment.words or [])]


def start_errors(truth: list[tuple[str, float]], heard: list[tuple[str, float]]) -> list[float]:
    """|start difference| in seconds for each word both lists hold, matched in order by their normalised text."""
    a, b = [_norm(w) for w, _ in truth], [_norm(w) for w, _ in heard]
    errors = []
    for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        for i in range(block.size):
            if a[block.a + i]:
                errors.append(abs(truth[block.a + i][1] - heard[block.b + i][1]))
    return errors


def piper_word_starts(alignments: list[tuple[str, int]], rate: int) -> list[float]:
    """Word start seconds from Piper's (phoneme, samples) list: a word starts where a '^' (sentence start) or ' '
    entry ends and a phoneme follows."""
    starts, position, after_boundary = [], 0, True
    for phoneme, samples in alignments:
        if phoneme in ("^", " "):
            after_boundary = True
        elif phoneme in ("$", ".", ",", "!", "?", ";", ":"):
            pass
        elif after_boundary:
            starts.append(position / rate)
            after_boundary = False
        position += int(samples)
    return starts


def summary(errors: list[float], words: int) -> dict:
    ms = np.array(errors) * 1000 if errors else np.zeros(0)
    return {"median_ms": round(float(np.median(ms)), 1) if len(ms) else None,
            "p90_ms": round(float(np.percentile(ms, 90)), 1) if len(ms) else None,
            "words_matched": len(errors), "words": words}


def bench_word_times(bundle: TTSBundle, sentences: list[str], mode: str = "s5", progress=None) -> dict:
    """S5's word starts and Piper's exact ones, each against Whisper's, on the same sentences."""
    from tts.data.voices import _piper_synthesize

    s5_errors, s5_words, floor_errors, floor_words, skipped = [], 0, [], 0, 0
    task = progress.add_task("word times", total=len(sentences)) if progress else None
    for i, text in enumerate(sentences):
        words = normalize_text(text)
        result = asyncio.run(speak(bundle, words, mode, config=SynthesisConfig(seed=i)))
        audio = np.concatenate([c.samples for c in result.chunks])
        timed = [(w.word, w.start_s) for w in result.times.word_times]
        s5_errors += start_errors(timed, whisper_word_starts(audio, bundle.codec.sample_rate))
        s5_words += len(timed)
        piper = _piper_synthesize(" ".join(words))
        starts = piper_word_starts(piper.phoneme_alignments or [], 22050)
        if len(starts) == len(words):  # Piper's words are ours (else its phonemizer split a word differently)
            truth = list(zip(words, starts))
            floor_errors += start_errors(truth, whisper_word_starts(piper.audio, 22050))
            floor_words += len(words)
        else:
            skipped += 1
        if progress:
            progress.advance(task)
    return {"sentences": len(sentences), "mode": mode, "s5": summary(s5_errors, s5_words),
            "piper_floor": summary(floor_errors, floor_words), "piper_sentences_skipped": skipped,
            "vocoder": getattr(getattr(bundle.codec, "config", None), "vocoder", None)}
