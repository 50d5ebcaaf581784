"""`s5 say`: one utterance through the streaming engine into a sink, words fed at a chosen rate."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from audio_io.sinks import ClockSink, DeviceSink, PlaybackStats
from tts.inference.streaming import (
    DEFAULT_MAX_STRETCH,
    StreamingSynthesizer,
    UtteranceTimes,
    feed_words,
)
from tts.inference.synthesis import SynthesisConfig, TTSBundle, VoicePrompt


@dataclass
class SayResult:
    words: int
    audio_s: float
    times: UtteranceTimes
    playback: PlaybackStats

    @property
    def first_audible_ms(self) -> float | None:
        if self.playback.first_audible_ns is None or not self.times.word_arrivals_ns:
            return None
        return (self.playback.first_audible_ns - self.times.word_arrivals_ns[0]) / 1e6

    @property
    def rtf(self) -> float | None:
        return self.times.compute_ns / 1e9 / self.audio_s if self.audio_s else None


async def say(bundle: TTSBundle, words: list[str], sink: ClockSink | DeviceSink, mode: str = "s5",
              words_per_second: float = 0.0, config: SynthesisConfig | None = None,
              prompt: VoicePrompt | None = None, max_stretch: float = DEFAULT_MAX_STRETCH) -> SayResult:
    synth = StreamingSynthesizer(bundle, mode, config, prompt=prompt, max_stretch=max_stretch)
    sink.begin_turn()
    feeder = asyncio.create_task(feed_words(synth, words, words_per_second))
    samples = 0
    try:
        async for chunk in synth.chunks():
            sink.write(chunk.samples, chunk.play_after_ns)
            samples += len(chunk.samples)
        sink.end_turn()
        await sink.drain()
    finally:
        feeder.cancel()
        await synth.aclose()
    return SayResult(len(words), samples / bundle.codec.sample_rate, synth.times, sink.stats)
