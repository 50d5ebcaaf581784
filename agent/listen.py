"""Hearing the user: microphone blocks -> Silero VAD utterances -> Whisper transcript, as `HeardLine`s.

The VAD runs on the event loop (about 8 ms of CPU per second of audio); utterances are transcribed in a worker
thread, so capture never waits for the ASR. Whisper starts on a guess, as soon as a short pause begins. `events()`
offers that guess's transcript as soon as it is ready (`HeardLine(guess=True)`: a turn may start on it, silent until
confirmed), then either the same line final, once the pause is long enough to be the end, or `SpeechResumed` if
the user goes on. `lines()` yields the final lines only.

With an `EchoGate` the listener keeps listening while the agent speaks: speech that starts while the player is
sounding counts only once it is louder than the agent's own voice can come back (`UserSpeaking` then: a barge-in);
until then it is taken for the echo and never transcribed.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from audio_io.asr import transcribe
from audio_io.echo import EchoGate
from audio_io.vad import VAD_RATE, SpeechSegmenter, VadConfig
from audio_io.wav import resample

LOUD_BLOCKS_FOR_BARGE_IN = 3  # consecutive blocks (96 ms) above the echo before speech over the agent counts


@dataclass
class HeardLine:
    text: str  # "" when the ASR heard no words (nothing is sent to the LLM then)
    speech_start_ns: int
    speech_end_ns: int
    transcript_ready_ns: int
    cut: bool = False  # the speech ran past the length limit and was cut there
    guess: bool = False  # the pause may not be the end yet: the same line comes again final, or SpeechResumed


@dataclass
class SpeechResumed:
    """The user went on speaking after a guess was offered: a turn started on it must go, unheard."""
    at_ns: int


@dataclass
class UserSpeaking:
    """The user started speaking over the agent (louder than its echo): interrupt it."""
    at_ns: int


class Listener:
    def __init__(self, microphone, config: VadConfig | None = None, echo: EchoGate | None = None):
        self.microphone = microphone
        self.segmenter = SpeechSegmenter(config)
        self.echo = echo

    @staticmethod
    async def warm_up() -> None:
        """Load Whisper and run it once (about 1.5 s), so the first question is not the one that pays for it."""
        import numpy as np

        await asyncio.to_thread(transcribe, np.zeros(VAD_RATE // 2, np.float32), VAD_RATE)

    async def lines(self) -> AsyncIterator[HeardLine]:
        """Final transcripts only."""
        async for event in self.events():
            if isinstance(event, HeardLine) and not event.guess:
                yield event

    async def events(self) -> AsyncIterator[HeardLine | SpeechResumed | UserSpeaking]:
        t0: int | None = None  # capture time of stream sample 0
        rate = self.microphone.rate
        at = lambda sample: t0 + round(sample / VAD_RATE * 1e9)  # noqa: E731
        pending: list[asyncio.Task] = []
        guess: tuple[tuple[int, int], asyncio.Task] | None = None  # (start, end) sample -> its transcript in the making
        offered: tuple[int, int] | None = None  # the guess already yielded
        echo_suspect, loud_blocks = False, 0  # the open utterance may be the agent's own voice
        async for block, captured in self.microphone.blocks():
            if rate != VAD_RATE:
                block = resample(block, rate, VAD_RATE)
            if t0 is None:
                t0 = captured
            was_speaking = self.segmenter.in_speech
            finished = self.segmenter.push(block)
            block_s = len(block) / VAD_RATE
            if self.segmenter.in_speech and not was_speaking:  # an utterance opens
                echo_suspect = self.echo is not None and self.echo.agent_speaking(captured, block_s)
                loud_blocks = 0
                if not echo_suspect:
                    yield UserSpeaking(captured)
            if echo_suspect and self.segmenter.in_speech:
                loud_blocks = loud_blocks + 1 if self.echo.louder_than_echo(block, captured, block_s) else 0
                if loud_blocks >= LOUD_BLOCKS_FOR_BARGE_IN:
                    echo_suspect = False
                    yield UserSpeaking(captured)
            new_guess = self.segmenter.guess()
            if new_guess is not None and not echo_suspect:  # an older guess is stale: the user spoke on since
                span = (new_guess.start_sample, new_guess.end_sample)
                guess = (span, asyncio.create_task(asyncio.to_thread(transcribe, new_guess.audio, VAD_RATE)))
            if offered is not None and self.segmenter.in_speech and not self.segmenter.guessed:
                offered = None  # the pause was not the end
                yield SpeechResumed(captured)
            for utterance in finished:
                span = (utterance.start_sample, utterance.end_sample)
                text = guess[1] if guess is not None and guess[0] == span else None
                offered = None
                if text is not None:
                    guess = None
                if echo_suspect:  # never louder than the echo: the agent heard itself
                    continue
                pending.append(asyncio.create_task(self._transcribe(utterance, at, text)))
            if finished and not self.segmenter.in_speech:
                echo_suspect = False
            current = self.segmenter.in_speech and self.segmenter.silent_blocks > 0 and guess is not None \
                and guess[0][1] == self.segmenter.last_voiced  # the guess is of the pause going on now
            if current and offered is None and guess[1].done():
                offered = guess[0]
                yield HeardLine(guess[1].result().strip(), at(offered[0]), at(offered[1]), time.perf_counter_ns(), guess=True)
            while pending and pending[0].done():
                yield pending.pop(0).result()
        for utterance in self.segmenter.flush():
            pending.append(asyncio.create_task(self._transcribe(utterance, at)))
        for task in pending:
            yield await task

    @staticmethod
    async def _transcribe(utterance, at, guessed: asyncio.Task | None = None) -> HeardLine:
        text = await guessed if guessed is not None else await asyncio.to_thread(transcribe, utterance.audio, VAD_RATE)
        return HeardLine(text.strip(), at(utterance.start_sample), at(utterance.end_sample), time.perf_counter_ns(),
                         utterance.cut)
