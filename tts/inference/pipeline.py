"""The one pipeline driver: spoken words in, audio through a sink (`docs/streaming_engine.md`).

    words stage   words (async, any rate) -> synth.push_word ... synth.end()
    audio stage   synth.chunks() -> sink.write

The synthesizer stamps its own events (`UtteranceTimes`: words in, chunks out) and the sink its own
(`PlaybackStats`: first audible sample, underruns); `SpeechResult` reads both.

`Speech.run(words)` is all of `s5 say`, `s5 eval` and `s5 bench tts`; the agent's turn runs the same two stages next
to its LLM stage (`agent/orchestrator.py`), so chat, replay and the benches measure what they play. The sink is the
one player model (`audio_io.sinks`): a sound card, or a clock that plays in simulated real time.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from audio_io.sinks import ClockSink, PlaybackStats
from tts.inference.streaming import (
    DEFAULT_MAX_STRETCH,
    SEGMENT_BREAK,
    AudioChunk,
    StreamingSynthesizer,
    UtteranceTimes,
)
from tts.inference.synthesis import SynthesisConfig, TTSBundle, VoicePrompt


class Sink(Protocol):
    """What the pipeline plays into: `audio_io.sinks.ClockSink`, `WavSink`, `DeviceSink`."""
    sample_rate: int
    stats: PlaybackStats
    output_latency_ns: int  # how long the output still sounds after a flush

    def begin_turn(self, held: bool = False) -> None: ...
    def release(self) -> None: ...
    def write(self, samples: np.ndarray, play_after_ns: int | None = None) -> None: ...
    def end_turn(self) -> None: ...
    async def drain(self) -> None: ...
    def flush(self) -> int: ...


@dataclass
class SpeechResult:
    times: UtteranceTimes
    playback: PlaybackStats
    chunks: list[AudioChunk]  # kept only when asked (`Speech(keep_chunks=True)`)

    @property
    def words(self) -> int:
        return self.times.spoken_words

    @property
    def audio_s(self) -> float:
        return self.times.audio_s

    @property
    def first_audible_ms(self) -> float | None:
        """First audible sample, as played, after the first word arrived."""
        if self.playback.first_audible_ns is None or not self.times.word_arrivals_ns:
            return None
        return (self.playback.first_audible_ns - self.times.word_arrivals_ns[0]) / 1e6

    @property
    def first_chunk_ms(self) -> float | None:
        """First chunk after synthesis was allowed to start (word k+1 for S5, the end of the text for T5)."""
        t = self.times
        if t.first_chunk_ns is None or t.start_allowed_ns is None:
            return None
        return (t.first_chunk_ns - t.start_allowed_ns) / 1e6

    @property
    def opening_ms(self) -> dict[str, float] | None:
        """Where the first sound's time went (ms), part by part: from the first word's arrival to the first decoded
        frame (the words' encoding and the wait for the decoder), the decoding of the frames the first sound needs,
        their render (with a wait for the render thread, among other streams), and the first chunk leaving the
        engine. None where the utterance sent no sound."""
        t = self.times
        marks = (t.first_word_ns, t.first_codec_frame_ns, t.first_render_asked_ns, t.first_render_done_ns,
                 t.first_chunk_ns)
        if any(mark is None for mark in marks):
            return None
        parts = ("to_first_frame", "decoding", "rendering", "to_chunk")
        return {part: (end - start) / 1e6 for part, start, end in zip(parts, marks, marks[1:])}

    @property
    def rtf(self) -> float | None:
        return self.times.compute_ns / 1e9 / self.audio_s if self.audio_s else None

    def gaps(self) -> list[dict]:
        """Every underrun: when in the audio, how long, and the words on either side of it."""
        return gap_report(self.playback, self.times)

    @property
    def audio(self) -> np.ndarray:
        return join_chunks(self.chunks)

    @property
    def codes(self) -> torch.Tensor | None:
        parts = [c.codes for c in self.chunks if c.codes is not None]
        return torch.cat(parts, dim=1) if parts else None


class Speech:
    """One utterance through one synthesizer into one sink; created per utterance, as the synthesizer is."""

    def __init__(self, synth: StreamingSynthesizer, sink: Sink, keep_chunks: bool = False):
        self.synth = synth
        self.sink = sink
        self.keep_chunks = keep_chunks
        self.chunks: list[AudioChunk] = []

    async def feed(self, words: AsyncIterable[str] | Iterable[str]) -> None:
        """Words stage: every word into the synthesizer as it comes, then the end of the text."""
        async for word in _as_async(words):
            if word == SEGMENT_BREAK:
                self.synth.push_break()
                continue
            self.synth.push_word(word)
        self.synth.end()

    async def play(self) -> None:
        """Audio stage: every chunk into the sink as soon as it is ready (a sink that shows words, e.g. a
        conversation's socket, is told each word's place in the audio before that audio)."""
        show_words = getattr(self.sink, "show_words", None)
        async for chunk in self.synth.chunks():
            if show_words is not None and chunk.word_times:
                show_words(chunk.word_times)
            self.sink.write(chunk.samples, chunk.play_after_ns)
            if self.keep_chunks:
                self.chunks.append(chunk)

    async def run(self, words: AsyncIterable[str] | Iterable[str]) -> SpeechResult:
        """Both stages, then wait until the sink has played it all (at once for an unpaced sink); a failure in
        either stage cancels the other and releases the synthesizer."""
        self.sink.begin_turn()
        try:
            async with asyncio.TaskGroup() as stages:
                stages.create_task(self.feed(words))
                stages.create_task(self.play())
            self.sink.end_turn()
            await self.sink.drain()
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None
        finally:
            await self.synth.aclose()
        return self.result()

    def result(self) -> SpeechResult:
        return SpeechResult(self.synth.times, self.sink.stats, self.chunks)


def gap_report(playback: PlaybackStats, times: UtteranceTimes) -> list[dict]:
    """Every underrun the player saw, with the words the engine sent on either side of it."""
    out = []
    for at_s, gap_ms in playback.gaps:
        before, after = times.words_around(at_s)
        out.append({"at_s": round(at_s, 2), "ms": round(gap_ms, 1), "before": before, "after": after})
    return out


async def _as_async(words: AsyncIterable[str] | Iterable[str]) -> AsyncIterator[str]:
    if isinstance(words, AsyncIterable):
        async for word in words:
            yield word
    else:
        for word in words:
            yield word


async def at_rate(words: list[str], words_per_second: float = 0.0) -> AsyncIterator[str]:
    """Words at a steady rate (0: all at once): an LLM stream stand-in for `s5 say` and the benches."""
    start = time.perf_counter()
    for i, word in enumerate(words):
        if words_per_second > 0:
            await asyncio.sleep(max(0.0, start + i / words_per_second - time.perf_counter()))
        yield word


async def speak(
    bundle: TTSBundle, words: list[str], mode: str = "s5", words_per_second: float = 0.0,
    config: SynthesisConfig | None = None, sink: Sink | None = None, emit_every: int | None = None,
    prompt: VoicePrompt | None = None, max_stretch: float = DEFAULT_MAX_STRETCH, keep_chunks: bool = True,
    traced_units: list | None = None, worker=None,
) -> SpeechResult:
    """`words` (already normalised) at a rate through a fresh synthesizer into `sink` (default: an unpaced clock
    sink, which times playback in real time without waiting for it). With `config.trace_attention`, the synthesis
    units (and their attention traces) are appended to `traced_units`."""
    synth = StreamingSynthesizer(bundle, mode, config, emit_every, prompt, max_stretch, worker=worker)
    sink = sink if sink is not None else ClockSink(bundle.codec.sample_rate, pace=False)
    result = await Speech(synth, sink, keep_chunks).run(at_rate(words, words_per_second))
    if traced_units is not None:
        traced_units.extend(synth.schedule.traced_units)
    return result


def join_chunks(chunks: list[AudioChunk]) -> np.ndarray:
    parts = [c.samples for c in chunks if len(c.samples)]
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)
