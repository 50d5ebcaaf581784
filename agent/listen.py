"""Hearing the user: microphone blocks -> Silero VAD utterances -> Whisper transcript, as `HeardLine`s.

The VAD runs on the event loop (about 8 ms of CPU per second of audio); utterances are transcribed in a worker
thread, so capture never waits for the ASR. Whisper starts on a guess, as soon as a short pause begins; when the
pause turns out to be the end (the VAD's `end_silence_ms`), that transcript is used and the wait for the end has
hidden the ASR's time. Speech that resumes discards the guess.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from audio_io.asr import transcribe
from audio_io.vad import VAD_RATE, SpeechSegmenter, VadConfig
from audio_io.wav import resample


@dataclass
class HeardLine:
    text: str  # "" when the ASR heard no words (nothing is sent to the LLM then)
    speech_start_ns: int
    speech_end_ns: int
    transcript_ready_ns: int
    cut: bool = False  # the speech ran past the length limit and was cut there


class Listener:
    def __init__(self, microphone, config: VadConfig | None = None):
        self.microphone = microphone
        self.segmenter = SpeechSegmenter(config)
        self.speech_started = asyncio.Event()  # set while the user is speaking (for barge-in)

    @staticmethod
    async def warm_up() -> None:
        """Load Whisper and run it once (about 1.5 s), so the first question is not the one that pays for it."""
        import numpy as np

        await asyncio.to_thread(transcribe, np.zeros(VAD_RATE // 2, np.float32), VAD_RATE)

    async def lines(self) -> AsyncIterator[HeardLine]:
        t0: int | None = None  # capture time of stream sample 0
        rate = self.microphone.rate
        pending: list[asyncio.Task] = []
        guesses: dict[tuple[int, int], asyncio.Task] = {}  # (start, end) sample -> its transcript in the making
        async for block, captured in self.microphone.blocks():
            if rate != VAD_RATE:
                block = resample(block, rate, VAD_RATE)
            if t0 is None:
                t0 = captured
            finished = self.segmenter.push(block)
            guess = self.segmenter.guess()
            if guess is not None:
                guesses = {(guess.start_sample, guess.end_sample): asyncio.create_task(asyncio.to_thread(
                    transcribe, guess.audio, VAD_RATE))}  # an older guess is stale: speech resumed since
            for utterance in finished:
                text = guesses.pop((utterance.start_sample, utterance.end_sample), None)
                pending.append(asyncio.create_task(self._transcribe(utterance, t0, text)))
            if self.segmenter.in_speech:
                self.speech_started.set()
            else:
                self.speech_started.clear()
            while pending and pending[0].done():
                yield pending.pop(0).result()
        for utterance in self.segmenter.flush():
            pending.append(asyncio.create_task(self._transcribe(utterance, t0 or 0)))
        for task in pending:
            yield await task

    @staticmethod
    async def _transcribe(utterance, t0: int, guessed: asyncio.Task | None = None) -> HeardLine:
        text = await guessed if guessed is not None else await asyncio.to_thread(transcribe, utterance.audio, VAD_RATE)
        at = lambda sample: t0 + round(sample / VAD_RATE * 1e9)  # noqa: E731
        return HeardLine(text.strip(), at(utterance.start_sample), at(utterance.end_sample), time.perf_counter_ns(),
                         utterance.cut)
