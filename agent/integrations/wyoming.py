"""S5 as a Wyoming TTS server (Home Assistant's protocol for local voices): `s5 wyoming --uri tcp://0.0.0.0:10200`.

Events, as Home Assistant sends them:
- `describe` -> `info`: one TTS program, "s5", with its voice, streaming supported;
- `synthesize` (outside a stream) -> `audio-start`, `audio-chunk`s as they are made, `audio-stop`;
- a stream: `synthesize-start`, `synthesize-chunk`s (an LLM's reply as it is written: spoken word by word, the
  first audio leaving before the stream ends), the whole text once more as a plain `synthesize` (for servers that
  do not stream: ignored inside a stream), `synthesize-stop` -> the rest of the audio, `audio-stop`,
  `synthesize-stopped`. Home Assistant takes the audio format from the first `audio-start` only.
- anything else, or a malformed event: an `error` event, and the connection stays usable.

Each connection is one `Handler`; every connection's speech runs on the one `StreamWorker` the server was given
(steps batched). Threads: the event loop only (synthesis runs on the worker).
"""
from __future__ import annotations

import asyncio
import logging

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler, AsyncServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from agent.serve.audio_formats import pcm16
from agent.text_speech import TextSpeech
from tts.inference.synthesis import SynthesisConfig, TTSBundle

log = logging.getLogger("s5.wyoming")
VOICE = "s5-default"
ATTRIBUTION = Attribution(name="S5 voice agent", url="https://github.com/")


def describe_s5() -> Info:
    voice = TtsVoice(name=VOICE, attribution=ATTRIBUTION, installed=True, version=None, languages=["en"],
                     description="S5-TTS, the shipped English voice, spoken word by word")
    program = TtsProgram(name="s5", attribution=ATTRIBUTION, installed=True, version=None, voices=[voice],
                         description="Streaming S5-TTS: speaks an LLM's reply while it is written",
                         supports_synthesize_streaming=True)
    return Info(tts=[program])


class Handler(AsyncEventHandler):
    """One client connection."""

    def __init__(self, reader, writer, bundle: TTSBundle, synthesis: SynthesisConfig, worker):
        super().__init__(reader, writer)
        self.bundle, self.synthesis, self.worker = bundle, synthesis, worker
        self.stream: TextSpeech | None = None  # the streamed synthesis under way
        self.pump: asyncio.Task | None = None  # sends its audio as it is made
        self.audio_started = False

    async def handle_event(self, event: Event) -> bool:
        try:
            await self._handle(event)
        except (KeyError, TypeError, ValueError) as error:  # a malformed event: say so, keep the connection
            await self.write_event(Error(text=f"bad {event.type} event: {error}", code="bad-event").event())
        return True

    async def _handle(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self.write_event(describe_s5().event())
        elif SynthesizeStart.is_type(event.type):
            await self._close_stream()
            self.stream = TextSpeech(self.bundle, synthesis=self.synthesis, worker=self.worker, max_stretch=1.0)
            self.pump = asyncio.create_task(self._send_audio(self.stream))
        elif SynthesizeChunk.is_type(event.type):
            if self.stream is None:
                raise ValueError("synthesize-chunk outside synthesize-start ... synthesize-stop")
            self.stream.push(SynthesizeChunk.from_event(event).text)
        elif Synthesize.is_type(event.type):
            if self.stream is not None:
                return  # inside a stream the whole text comes again for servers that do not stream: spoken already
            speech = TextSpeech(self.bundle, synthesis=self.synthesis, worker=self.worker, max_stretch=1.0)
            speech.push(Synthesize.from_event(event).text)
            speech.end()
            await self._send_audio(speech)
            await self.write_event(AudioStop().event())
            self.audio_started = False
        elif SynthesizeStop.is_type(event.type):
            if self.stream is None:
                raise ValueError("synthesize-stop without synthesize-start")
            self.stream.end()
            await self.pump
            self.stream = self.pump = None
            await self.write_event(AudioStop().event())
            await self.write_event(SynthesizeStopped().event())
            self.audio_started = False
        else:
            raise ValueError(f"not a TTS event this server handles ({event.type})")

    async def _send_audio(self, speech: TextSpeech) -> None:
        rate = speech.sample_rate
        try:
            async for chunk in speech.chunks():
                if not self.audio_started:
                    await self.write_event(AudioStart(rate=rate, width=2, channels=1).event())
                    self.audio_started = True
                await self.write_event(AudioChunk(rate=rate, width=2, channels=1, audio=pcm16(chunk.samples)).event())
            if not self.audio_started:  # nothing speakable: the client still gets a (silent) stream to close
                await self.write_event(AudioStart(rate=rate, width=2, channels=1).event())
                self.audio_started = True
        finally:
            await speech.aclose()

    async def _close_stream(self) -> None:
        if self.pump is not None:
            self.pump.cancel()
            await asyncio.gather(self.pump, return_exceptions=True)
        self.stream = self.pump = None

    async def disconnect(self) -> None:
        await self._close_stream()  # a client that vanished stops its synthesis


async def serve_wyoming(uri: str, bundle: TTSBundle, synthesis: SynthesisConfig, worker,
                        started: asyncio.Event | None = None) -> None:
    """Run the server at `uri` (tcp://HOST:PORT or unix://PATH) until cancelled."""
    server = AsyncServer.from_uri(uri)

    def handler(reader, writer) -> Handler:
        return Handler(reader, writer, bundle, synthesis, worker)

    if started is None:
        await server.run(handler)
        return
    await server.start(handler)
    started.set()
    try:
        await asyncio.Future()
    finally:
        await server.stop()
