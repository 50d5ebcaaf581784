"""S5 as a pipecat TTS service: `S5TTSService()` speaks with the shipped voice and the defaults.

It is fed the LLM's text frames as they stream (pipecat's TOKEN aggregation: no waiting for sentences, which is
S5's whole point), one S5 utterance per turn context, and puts out `TTSAudioRawFrame`s at the codec's rate as the
engine makes them, each turn's words with their times through pipecat's own word-timestamp mechanism
(`add_word_timestamps`, which becomes `TTSTextFrame`s as the audio plays, so pipecat's context aggregator keeps
what was heard). On pipecat's interruption the utterance is closed: synthesis stops within one chunk. A failure
is one line as a pipecat `ErrorFrame`.

Services that share a `S5Voice` (the loaded voice and one batched worker) run their steps together:

    voice = S5Voice.load()
    tts_a, tts_b = S5TTSService(voice=voice), S5TTSService(voice=voice)

Threads: pipecat's event loop; the synthesis runs on the voice's worker thread.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import numpy as np
from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.services.tts_service import TextAggregationMode, TTSService

from agent.serve.audio_formats import pcm16
from agent.text_speech import TextSpeech
from audio_io.errors import UserError
from tts.inference.batching import StreamWorker, render_threads_for
from tts.inference.streaming import load_bundle
from tts.inference.synthesis import SynthesisConfig, TTSBundle


@dataclass
class S5Voice:
    """The loaded voice and the worker its streams run on: what several services in one process share."""
    bundle: TTSBundle
    worker: StreamWorker
    synthesis: SynthesisConfig

    @classmethod
    def load(cls, vocoder: str | None = None, threads: int = 1, synthesis: SynthesisConfig | None = None) -> "S5Voice":
        return cls(load_bundle("s5", vocoder=vocoder, render_threads=render_threads_for(threads)),
                   StreamWorker(threads), synthesis or SynthesisConfig())


class S5TTSService(TTSService):
    def __init__(self, *, voice: S5Voice | None = None, **kwargs):
        self.voice = voice or S5Voice.load()
        kwargs.setdefault("text_aggregation_mode", TextAggregationMode.TOKEN)
        super().__init__(sample_rate=self.voice.bundle.codec.sample_rate, push_text_frames=False,
                         push_start_frame=True, push_stop_frames=False, **kwargs)
        self._utterances: dict[str, tuple[TextSpeech, asyncio.Task]] = {}  # turn context -> its speech

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """A piece of the turn's text: into its utterance (opened on the turn's first piece); the audio comes from
        the utterance's own task, so nothing is yielded here but `None` (or one error line)."""
        try:
            if context_id not in self._utterances:
                speech = TextSpeech(self.voice.bundle, synthesis=self.voice.synthesis, worker=self.voice.worker,
                                    max_stretch=1.0)
                self._utterances[context_id] = (speech, self.create_task(self._play(context_id, speech)))
            self._utterances[context_id][0].push(text)
            yield None
        except UserError as error:
            yield ErrorFrame(error=f"S5: {error}")

    async def flush_audio(self, context_id: str | None = None):
        """The turn's text is complete: its last words need no lookahead."""
        entry = self._utterances.get(context_id or self.get_active_audio_context_id() or "")
        if entry is not None:
            entry[0].end()

    async def _play(self, context_id: str, speech: TextSpeech) -> None:
        rate, spoke = speech.sample_rate, False
        try:
            async for chunk in speech.chunks():
                if chunk.word_times:
                    await self.add_word_timestamps([(w.word, w.start_s) for w in chunk.word_times], context_id)
                if len(chunk.samples):
                    spoke = True
                    await self.stop_ttfb_metrics()
                    await self.append_to_audio_context(
                        context_id, TTSAudioRawFrame(audio=pcm16(chunk.samples), sample_rate=rate, num_channels=1,
                                                     context_id=context_id))
            if not spoke:  # nothing speakable (emoji, a code block): a moment of silence, so pipecat does not take
                # a reply that is silent by design for a service gone quiet
                silence = np.zeros(rate // 50, np.float32)
                await self.append_to_audio_context(
                    context_id, TTSAudioRawFrame(audio=pcm16(silence), sample_rate=rate, num_channels=1,
                                                 context_id=context_id))
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # one line for the pipeline; the turn ends, the service goes on
            await self.push_error(error_msg=f"S5 failed to speak: {type(error).__name__}: {error}", exception=error)
        finally:
            await speech.aclose()
            self._utterances.pop(context_id, None)

    async def on_audio_context_interrupted(self, context_id: str):
        """Barge-in: the utterance stops (its worker finishes at most the unit of work it is in)."""
        entry = self._utterances.pop(context_id, None)
        if entry is not None:
            speech, task = entry
            await self.cancel_task(task)
            await speech.aclose()
        await super().on_audio_context_interrupted(context_id)

    async def stop(self, frame):
        await super().stop(frame)  # lets every turn's audio finish playing first
        await self._close_all()

    async def cancel(self, frame):
        await self._close_all()
        await super().cancel(frame)

    async def _close_all(self) -> None:
        for context_id in list(self._utterances):
            speech, task = self._utterances.pop(context_id)
            await self.cancel_task(task)
            await speech.aclose()
