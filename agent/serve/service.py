"""The server's transport-free core: everything `s5 serve` does, with no web framework in it. Two thin adapters put
it on the network: aiohttp for the standalone server (`server.py`) and ASGI for Ray Serve's ingress (`asgi.py`,
`ray_serve.py`); each only moves bytes and maps `RequestError` to its status.

One `VoiceService` per server process (a Ray replica is one): the loaded voices, the one batched worker every
session's synthesis runs on, the session slots and the metrics. Per request: `speech_request(body)` checks an
OpenAI speech body, `speak(request)` yields its encoded audio as it is synthesised; per conversation:
`converse(receive, send_json, send_bytes)` runs one `session.Conversation` until the client leaves, idles out or
stops reading. Nothing of one session is visible to another (the models are shared read-only).

Threads: the event loop owns this object; synthesis runs on the worker's thread (`tts/inference/batching.py`).
"""
from __future__ import annotations

import asyncio
import base64
import hmac
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from agent.orchestrator import AgentConfig
from agent.serve.audio_formats import FORMATS, Encoder, pcm16
from agent.serve.session import Conversation
from audio_io.sinks import ClockSink
from tts.frontend.text import normalize_text
from tts.inference.batching import STOP_WAIT_S, StreamWorker
from tts.inference.pipeline import Speech
from tts.inference.streaming import StreamingSynthesizer
from tts.inference.synthesis import TTSBundle

VOICES = ("default",)  # the shipped voice; more when more are trained
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")  # the
# names apps send: each speaks with the shipped voice, so that an app written for OpenAI works unchanged
MODEL_ALIASES = {"tts-1": "s5", "tts-1-hd": "s5", "gpt-4o-mini-tts": "s5"}  # OpenAI's model names -> S5
VOCODERS = ("default", "universal", "fast")  # a speech request's "vocoder": the server's (`s5 serve --vocoder`,
# fast unless told), HiFi-GAN V1 (natural, about a core per stream here), or iSTFT
STATIC = Path(__file__).parent / "static"  # the browser page: plain JavaScript, no build step
CLOSE_GOING_AWAY, CLOSE_POLICY, CLOSE_RESTART = 1001, 1008, 1012  # WebSocket close codes (RFC 6455)


@dataclass
class ServeConfig:
    max_sessions: int = 8  # requests synthesising at once; more get a 503 at once, not a wait (`s5 bench serve`:
    # the figure for two cores is in docs/results.md)
    max_input_chars: int = 4096
    token: str | None = None  # when set, requests need "Authorization: Bearer <token>"
    idle_timeout_s: float = 300.0  # a conversation with no message for this long is closed (its slot freed)
    batch_decode: bool = True  # one worker runs every session, decoder steps batched (`tts/inference/batching.py`)
    worker_threads: int = 2  # torch threads of that worker
    renders: str | None = None  # where that worker renders (`batching.RENDER_MODES`; None: its default, a render
    # thread of its own with two threads or more: docs/results.md, where the worker renders)
    turn: AgentConfig = field(default_factory=AgentConfig)  # conversations' and requests' settings (`--config`)
    send_queue_bytes: int = 1 << 20  # what may wait for a conversation's client (about 24 s of audio): a client
    # that stops reading is closed once more waits, so it cannot hold the server's memory or stall others
    socket_send_buffer: int = 262144  # the kernel's send buffer per conversation socket, fixed (unset, Linux grows
    # it to megabytes for a client that does not read): with the queue, what a session can hold is bounded


class RequestError(Exception):
    """A request refused with an HTTP status and a one-line reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class SpeechRequest:
    bundle: TTSBundle
    model: str  # "s5" or "t5"
    words: list[str]
    response_format: str
    sse: bool  # OpenAI's server-sent events instead of bare audio

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.sse else Encoder(self.response_format, self.bundle.codec.sample_rate).content_type


@dataclass
class Closing:
    """Why the server ends a conversation, for the adapter's close frame."""
    code: int
    reason: str


class QueueSink(ClockSink):
    """A player that hands what it plays to the response writer (and keeps the player clock's statistics)."""

    def __init__(self, sample_rate: int):
        super().__init__(sample_rate, pace=False)
        self.queue: asyncio.Queue[np.ndarray | None] = asyncio.Queue()

    def _record(self, samples: np.ndarray) -> None:
        self.queue.put_nowait(samples)

    def end_turn(self) -> None:
        super().end_turn()
        self.queue.put_nowait(None)


class Outbox:
    """What waits for one conversation's client, bounded in bytes: past `limit` it stops taking and sets `stalled`
    (the client is not reading), so a slow client holds at most `limit` of the server's memory."""

    EVENT_BYTES = 64  # an event's nominal size: small, but counted, so a flood of them cannot grow unbounded

    def __init__(self, limit: int):
        self.limit, self.waiting = limit, 0
        self.queue: asyncio.Queue = asyncio.Queue()
        self.stalled = asyncio.Event()

    def put(self, payload: dict | bytes) -> None:
        if self.stalled.is_set():
            return
        size = len(payload) if isinstance(payload, bytes) else self.EVENT_BYTES
        if self.waiting + size > self.limit:
            self.stalled.set()
            return
        self.waiting += size
        self.queue.put_nowait((payload, size))

    async def drain(self, send_json: Callable[[dict], Awaitable[None]],
                    send_bytes: Callable[[bytes], Awaitable[None]]) -> None:
        while True:
            payload, size = await self.queue.get()
            await (send_bytes(payload) if isinstance(payload, bytes) else send_json(payload))
            self.waiting -= size


class VoiceService:
    """bundles: model name ("s5", "t5") -> its loaded voice; llm_factory: () -> a new LLM backend per conversation
    (None: conversations are off); metrics: `metrics.ServerMetrics` or `ray_serve.RayMetrics` (the same calls)."""

    def __init__(self, bundles: dict[str, TTSBundle], config: ServeConfig, llm_factory, metrics, replica: str = ""):
        """`replica`: this process's name among several (Ray's replica tag), in /health and each "ready" event."""
        self.bundles, self.config, self.llm_factory, self.metrics = bundles, config, llm_factory, metrics
        self.replica = replica
        # one worker for every voice and session: two threads of their own would fight over the cores
        self.worker = StreamWorker.for_renders(config.worker_threads, config.renders) if config.batch_decode \
            else None
        self.active = 0  # sessions holding a slot
        self.draining, self.drained = False, asyncio.Event()  # set by `drain`
        self.revoiced: dict[tuple[str, str], TTSBundle] = {}

    @property
    def live_streams(self) -> int:
        return self.worker.live_streams if self.worker is not None else self.active

    def close(self) -> None:
        """The server stops: its worker finishes the calls in flight (the sessions are gone) and ends."""
        if self.worker is not None:
            self.worker.close(wait_s=STOP_WAIT_S)

    def health(self) -> dict:
        models = sorted(self.bundles) + [alias for alias, model in MODEL_ALIASES.items() if model in self.bundles]
        where = {"replica": self.replica, "pid": os.getpid()} if self.replica else {}
        return {"status": "ok", "models": models, "voices": list(VOICES + OPENAI_VOICES),
                "sessions": self.active, "max_sessions": self.config.max_sessions, **where}

    def take_slot(self, kind: str) -> Callable[[], None]:
        """One of the `max_sessions` slots for a request or conversation, and the call that gives it back;
        RequestError 503 at once when none is free (a wait would only move the queue into the client's timeout)."""
        if self.active >= self.config.max_sessions or self.draining:
            self.metrics.refused(kind)
            what = "requests are being spoken" if kind == "speech" else "sessions at once"
            raise RequestError(503, f"busy: {self.config.max_sessions} {what}; try again shortly")
        self.active += 1
        self.metrics.opened(kind)
        self.metrics.live_streams(self.live_streams)
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if not given_back:
                given_back = True
                self.active -= 1
                self.metrics.live_streams(self.live_streams)

        return give_back

    @asynccontextmanager
    async def slot(self, kind: str):
        give_back = self.take_slot(kind)
        try:
            yield
        finally:
            give_back()

    def drain(self) -> None:
        """Stop taking sessions; each conversation ends after the reply it is speaking (at once when idle), with
        close code 1012 (service restart) so that its client reconnects elsewhere and resumes."""
        self.draining = True
        self.drained.set()

    def _voiced(self, model: str, vocoder: str) -> TTSBundle:
        """A model voiced by another vocoder, made on first request (the model's weights shared)."""
        if vocoder == "default":
            return self.bundles[model]
        if (model, vocoder) not in self.revoiced:
            self.revoiced[model, vocoder] = self.bundles[model].with_vocoder(vocoder)
        return self.revoiced[model, vocoder]

    def speech_request(self, body) -> SpeechRequest:
        """An OpenAI speech body, checked: RequestError 400 says what is wrong with it."""
        if not isinstance(body, dict):
            raise RequestError(400, "the body must be a JSON object")
        model, text = MODEL_ALIASES.get(body.get("model", "s5"), body.get("model", "s5")), body.get("input")
        voice, response_format = body.get("voice", "default"), body.get("response_format", "mp3")
        vocoder, stream_format = body.get("vocoder", "default"), body.get("stream_format", "audio")
        if vocoder not in VOCODERS:
            raise RequestError(400, f"unknown vocoder {vocoder!r}; valid: {', '.join(VOCODERS)}")
        if model not in self.bundles:
            valid = ", ".join(sorted(self.bundles) + list(MODEL_ALIASES))
            raise RequestError(400, f"unknown model {model!r}; valid: {valid}")
        if voice not in VOICES + OPENAI_VOICES:
            raise RequestError(400, f"unknown voice {voice!r}; valid: {', '.join(VOICES + OPENAI_VOICES)}")
        if stream_format not in ("audio", "sse"):
            raise RequestError(400, f"unknown stream_format {stream_format!r}; valid: audio, sse")
        if response_format not in FORMATS:
            raise RequestError(400, f"unknown response_format {response_format!r}; valid: {', '.join(FORMATS)}")
        if body.get("speed", 1.0) != 1.0:
            raise RequestError(400, "speed: only 1.0 is supported")
        if not isinstance(text, str) or not text.strip():
            raise RequestError(400, "input: the text to speak is missing or empty")
        if len(text) > self.config.max_input_chars:
            raise RequestError(400, f"input: {len(text)} characters; at most {self.config.max_input_chars}")
        words = normalize_text(text)
        if not words:
            raise RequestError(400, "input: nothing speakable in it")
        return SpeechRequest(self._voiced(model, vocoder), model, words, response_format, stream_format == "sse")

    async def speak(self, request: SpeechRequest) -> AsyncIterator[bytes]:
        """The request's audio, encoded, each piece as soon as it is made (OpenAI's `speech.audio.delta` events
        with base64 audio, then `speech.audio.done`, with `sse`). Closing the iterator early (the client went
        away) stops the synthesis."""
        rate = request.bundle.codec.sample_rate
        sink, encoder = QueueSink(rate), Encoder(request.response_format, rate)
        synth = StreamingSynthesizer(request.bundle, "s5" if request.model == "s5" else "t5",
                                     replace(self.config.turn.synthesis, seed=0), max_stretch=1.0, worker=self.worker)
        speaking = asyncio.create_task(Speech(synth, sink).run(request.words))
        # a synthesis that fails ends the stream too (the loop below must not wait for audio that never comes)
        speaking.add_done_callback(lambda task: task.cancelled() or task.exception() is None
                                   or sink.queue.put_nowait(None))

        def framed(data: bytes) -> bytes:
            if not request.sse or not data:
                return data
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            return f"data: {json.dumps(event)}\n\n".encode()

        try:
            while (samples := await sink.queue.get()) is not None:
                if data := framed(encoder.encode(samples)):
                    yield data
            result = await speaking  # a synthesis failure surfaces (the client sees a cut stream; the log has it)
            self.metrics.speech(result)
            if data := framed(encoder.finish()):
                yield data
            if request.sse:
                n = len(request.words)
                usage = {"input_tokens": n, "output_tokens": 0, "total_tokens": n}
                yield f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode()
        finally:
            speaking.cancel()

    async def converse(self, receive: Callable[[], Awaitable[dict | bytes | None]],
                       send_json: Callable[[dict], Awaitable[None]],
                       send_bytes: Callable[[bytes], Awaitable[None]]) -> Closing | None:
        """One conversation (the caller holds its slot) until the client closes (`receive` returns None; a
        message that is not a JSON object arrives as {}), idles for `idle_timeout_s`, or stops reading (its
        outbox fills): then the Closing the adapter closes with. Events and audio go out through one writer, so
        a client that stops reading never stalls another session."""
        if self.llm_factory is None:
            raise RequestError(404, "this server has no LLM: conversations are off")
        outbox = Outbox(self.config.send_queue_bytes)
        conversation = Conversation(self.bundles, self.llm_factory, self.config.turn, self.worker, outbox.put,
                                    lambda samples: outbox.put(pcm16(samples)), self.config.max_input_chars,
                                    on_turn=self.metrics.turn)
        writer = asyncio.create_task(outbox.drain(send_json, send_bytes))
        conversation.ready(**({"replica": self.replica} if self.replica else {}))
        draining = asyncio.create_task(self.drained.wait())
        try:
            while True:
                receiving = asyncio.create_task(asyncio.wait_for(receive(), self.config.idle_timeout_s))
                stall = asyncio.create_task(outbox.stalled.wait())
                try:
                    done, _ = await asyncio.wait({receiving, stall, writer, draining},
                                                 return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:  # the server is shutting down
                    receiving.cancel()
                    raise
                finally:
                    stall.cancel()
                if draining in done and receiving not in done:
                    receiving.cancel()
                    if conversation.turn is not None:  # the reply being spoken ends first, and is sent
                        await asyncio.gather(conversation.turn, return_exceptions=True)
                    while outbox.waiting and not writer.done():
                        await asyncio.sleep(0.02)
                    return Closing(CLOSE_RESTART, "the server is restarting: reconnect and resume")
                if receiving not in done:
                    receiving.cancel()
                    reason = "the client stopped reading" if outbox.stalled.is_set() else "the connection failed"
                    return Closing(CLOSE_POLICY, reason)
                try:
                    message = receiving.result()
                except asyncio.TimeoutError:
                    outbox.put({"type": "error", "message": f"idle for {self.config.idle_timeout_s:.0f} s: closing"})
                    await asyncio.sleep(0.05)  # let the writer send it
                    return Closing(CLOSE_GOING_AWAY, "idle")
                if message is None:
                    return None
                await conversation.receive(message)
        finally:
            draining.cancel()
            await conversation.close()
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)


def parse_text_message(data: str) -> dict:
    """A WebSocket text frame as the conversation reads it: a JSON object, else {} (which it answers with an error)."""
    try:
        message = json.loads(data)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def bearer_ok(token: str, header: str, query_token: str) -> bool:
    """The request's bearer token (its Authorization header, or ?token= where a browser cannot set headers on a
    WebSocket) against `token`, in constant time: the time a refusal takes says nothing about how much of a guess
    was right."""
    expected = f"Bearer {token}".encode()
    return hmac.compare_digest(header.encode(), expected) | hmac.compare_digest(f"Bearer {query_token}".encode(), expected)


OPEN_PATHS = ("/", "/health")  # the page and the health check need no token
