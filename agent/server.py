"""`s5 serve`: S5-TTS as a streaming speech server (aiohttp).

    GET  /health             {"status": "ok", "models": [...], "voices": [...], "sessions": n, "max_sessions": m}
    POST /v1/audio/speech    OpenAI-style: {"model": "s5"|"t5", "input": text, "voice": "default",
                             "response_format": "wav"|"pcm", "speed": 1.0}; the audio streams as it is synthesised
                             (wav: 16-bit mono with an open-ended header; pcm: raw s16le; X-Sample-Rate says the rate)

Each request runs the one pipeline driver (`tts.inference.pipeline.Speech`) with its own synthesizer and sink;
the models are shared read-only, so nothing of one request is visible to another and replicas scale out behind
any load balancer that checks /health. Errors are JSON `{"error": {"message": ...}}` with a 4xx/5xx status.
"""
from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

import numpy as np
from aiohttp import web

from audio_io.sinks import ClockSink
from tts.frontend.text import normalize_text
from tts.inference.pipeline import Speech
from tts.inference.streaming import StreamingSynthesizer
from tts.inference.synthesis import SynthesisConfig, TTSBundle

VOICES = ("default",)  # the shipped voice; more when more are trained
FORMATS = ("wav", "pcm")
SESSIONS = web.AppKey("sessions", asyncio.Semaphore)  # the free synthesis slots


@dataclass
class ServeConfig:
    max_sessions: int = 4  # requests synthesising at once; more get a 503 at once, not a wait
    max_input_chars: int = 4096
    token: str | None = None  # when set, requests need "Authorization: Bearer <token>"


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


def wav_header(sample_rate: int) -> bytes:
    """A 16-bit mono WAV header whose sizes say "until the stream ends" (0xFFFFFFFF), as streaming servers send."""
    unknown = 0xFFFFFFFF
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVE" + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate,
            sample_rate * 2, 2, 16) + b"data" + struct.pack("<I", unknown))


def pcm16(samples: np.ndarray) -> bytes:
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def create_app(bundles: dict[str, TTSBundle], config: ServeConfig | None = None) -> web.Application:
    """bundles: model name ("s5", "t5") -> its loaded voice."""
    config = config or ServeConfig()
    sessions = asyncio.Semaphore(config.max_sessions) if config.max_sessions > 0 else None
    app = web.Application(client_max_size=64 * 1024, middlewares=[_auth(config.token)] if config.token else [])
    if sessions is not None:
        app[SESSIONS] = sessions
    active = {"n": 0}

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "models": sorted(bundles), "voices": list(VOICES),
                                  "sessions": active["n"], "max_sessions": config.max_sessions})

    async def speech(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return error(400, "the body must be JSON: {\"model\": ..., \"input\": ...}")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        model, text = body.get("model", "s5"), body.get("input")
        voice, response_format = body.get("voice", "default"), body.get("response_format", "wav")
        if model not in bundles:
            return error(400, f"unknown model {model!r}; valid: {', '.join(sorted(bundles))}")
        if voice not in VOICES:
            return error(400, f"unknown voice {voice!r}; valid: {', '.join(VOICES)}")
        if response_format not in FORMATS:
            return error(400, f"unknown response_format {response_format!r}; valid: {', '.join(FORMATS)}")
        if body.get("speed", 1.0) != 1.0:
            return error(400, "speed: only 1.0 is supported")
        if not isinstance(text, str) or not text.strip():
            return error(400, "input: the text to speak is missing or empty")
        if len(text) > config.max_input_chars:
            return error(400, f"input: {len(text)} characters; at most {config.max_input_chars}")
        words = normalize_text(text)
        if not words:
            return error(400, "input: nothing speakable in it")
        if sessions is None or sessions.locked():
            return error(503, f"busy: {config.max_sessions} requests are being spoken; try again shortly")
        async with sessions:
            active["n"] += 1
            try:
                return await _stream(request, bundles[model], model, words, response_format)
            finally:
                active["n"] -= 1

    app.router.add_get("/health", health)
    app.router.add_post("/v1/audio/speech", speech)
    return app


async def _stream(request: web.Request, bundle: TTSBundle, model: str, words: list[str], response_format: str):
    rate = bundle.codec.sample_rate
    sink = QueueSink(rate)
    synth = StreamingSynthesizer(bundle, "s5" if model == "s5" else "t5", SynthesisConfig(seed=0), max_stretch=1.0)
    speaking = asyncio.create_task(Speech(synth, sink).run(words))
    # a synthesis that fails ends the stream too (the writer below must not wait for audio that never comes)
    speaking.add_done_callback(lambda task: task.cancelled() or task.exception() is None or sink.queue.put_nowait(None))
    response = web.StreamResponse(headers={"Content-Type": "audio/wav" if response_format == "wav" else "audio/pcm",
                                           "X-Sample-Rate": str(rate)})
    await response.prepare(request)
    try:
        if response_format == "wav":
            await response.write(wav_header(rate))
        while (samples := await sink.queue.get()) is not None:
            await response.write(pcm16(samples))
        await speaking  # a synthesis failure surfaces (the client sees a cut stream; the log has the traceback)
    finally:
        speaking.cancel()  # a client that went away stops the synthesis
    await response.write_eof()
    return response


def _auth(token: str):
    @web.middleware
    async def check(request: web.Request, handler):
        if request.path != "/health" and request.headers.get("Authorization") != f"Bearer {token}":
            return error(401, "missing or wrong bearer token")
        return await handler(request)

    return check
