"""One reply of streamed text, spoken as it comes: the transport-free core under the framework adapters
(`agent/integrations/`: Wyoming, pipecat). They translate their own events into these calls and nothing more.

    speech = TextSpeech(bundle, worker=worker)
    speech.push("Sure, the train")       # text pieces as an LLM writes them, any size
    speech.push(" leaves at 6:05 pm.")
    speech.end()
    async for chunk in speech.chunks():  # AudioChunk: samples, and the words whose start it carries
        ...
    await speech.aclose()                # always; also to stop early (a barge-in)

Threads: every call on the event loop; the synthesis runs on the worker (`tts/inference/streaming.py`).
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from agent.segmenter import SpokenWords
from tts.inference.stream_parts import DEFAULT_MAX_STRETCH, SEGMENT_BREAK, AudioChunk
from tts.inference.streaming import StreamingSynthesizer
from tts.inference.synthesis import SynthesisConfig, TTSBundle


class TextSpeech:
    def __init__(self, bundle: TTSBundle, mode: str = "s5", synthesis: SynthesisConfig | None = None,
                 worker=None, max_stretch: float = DEFAULT_MAX_STRETCH):
        self.words = SpokenWords()
        self.synth = StreamingSynthesizer(bundle, mode, synthesis, max_stretch=max_stretch, worker=worker)
        self.sample_rate = bundle.codec.sample_rate
        self.ended = False

    def push(self, text: str) -> None:
        """A piece of the text; words are spoken once whitespace follows them (or at `end`)."""
        self.synth.note_token(time.perf_counter_ns())
        self._speak(self.words.push(text, time.perf_counter_ns()))

    def end(self) -> None:
        if not self.ended:
            self.ended = True
            self._speak(self.words.flush(time.perf_counter_ns()))
            self.synth.end()

    def _speak(self, words: list[str]) -> None:
        for word in words:
            if word == SEGMENT_BREAK:
                self.synth.push_break()
            else:
                self.synth.push_word(word)

    async def chunks(self) -> AsyncIterator[AudioChunk]:
        async for chunk in self.synth.chunks():
            yield chunk

    async def aclose(self) -> None:
        await self.synth.aclose()
