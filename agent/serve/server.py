"""`s5 serve`: S5-TTS as a streaming speech server (aiohttp).

    GET  /                   a page to talk to it from a browser (type, hear the answer stream, switch s5/t5/sentence)
    GET  /health             {"status": "ok", "models": [...], "voices": [...], "sessions": n, "max_sessions": m}
    GET  /ws                 a conversation (`session.py` has its messages): text or microphone in; the LLM's
                             text, each word with its time, audio as it plays, the turn's record and the history
                             out; a client that reconnects sends `resume` with the history it kept
    GET  /metrics            Prometheus text format (`metrics.py`)
    POST /v1/audio/speech    OpenAI's speech endpoint: {"model": "s5"|"t5" (or OpenAI's "tts-1", "tts-1-hd",
                             "gpt-4o-mini-tts": S5), "input": text, "voice": "default" (or an OpenAI voice name:
                             the shipped voice), "response_format": mp3 (default)|opus|aac|flac|wav|pcm, "speed": 1.0,
                             "stream_format": "audio"|"sse", "vocoder": "default"|"universal"|"fast"}; the audio
                             streams as it is synthesised (`audio_formats.py`; X-Sample-Rate says pcm's rate)

Each request runs the one pipeline driver (`tts.inference.pipeline.Speech`) with its own synthesizer and sink;
the models are shared read-only, so nothing of one request is visible to another. With `--token`, every route
but the page and /health needs it (compared in constant time), the WebSocket upgrade included. A conversation's
client that stops reading is closed once `send_queue_bytes` wait for it. Errors are JSON
`{"error": {"message": ...}}` with a 4xx/5xx status.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
import base64
import hmac
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from aiohttp import WSCloseCode, web

from audio_io.sinks import ClockSink
from tts.frontend.text import normalize_text
from tts.inference.pipeline import Speech
from tts.inference.batching import StreamWorker
from tts.inference.streaming import StreamingSynthesizer
from tts.inference.synthesis import SynthesisConfig, TTSBundle

from agent.serve.audio_formats import FORMATS, Encoder, pcm16
from agent.serve.metrics import ServerMetrics
from agent.serve.session import Conversation
from agent.orchestrator import AgentConfig

VOICES = ("default",)  # the shipped voice; more when more are trained
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse")  # the
# names apps send: each speaks with the shipped voice, so that an app written for OpenAI works unchanged
MODEL_ALIASES = {"tts-1": "s5", "tts-1-hd": "s5", "gpt-4o-mini-tts": "s5"}  # OpenAI's model names -> S5
VOCODERS = ("default", "universal", "fast")  # POST /v1/audio/speech "vocoder": the server's (`s5 serve --vocoder`,
# fast unless told), HiFi-GAN V1 (natural; 0.4-0.5 CPU-s a second of audio where the CPU has bfloat16: two streams
# on two cores, against eight with iSTFT), or iSTFT
STATIC = Path(__file__).parent / "static"  # the browser page: plain JavaScript, no build step
SESSIONS = web.AppKey("sessions", asyncio.Semaphore)  # the free synthesis slots


@dataclass
class ServeConfig:
    max_sessions: int = 8  # requests synthesising at once; more get a 503 at once, not a wait. `s5 bench serve` on
    # two cores: 8 sessions stay real time with 0 underruns (first audible p95 382 ms), 16 do not
    max_input_chars: int = 4096
    token: str | None = None  # when set, requests need "Authorization: Bearer <token>"
    idle_timeout_s: float = 300.0  # a conversation with no message for this long is closed (its slot freed)
    batch_decode: bool = True  # one worker runs every session, decoder steps batched (`tts/inference/batching.py`)
    worker_threads: int = 2  # torch threads of that worker (two cores, 8 sessions: first audible p95 508 ms at 1, 394 at 2)
    turn: AgentConfig = field(default_factory=AgentConfig)  # conversations' and requests' settings (`s5 serve --config`)
    send_queue_bytes: int = 1 << 20  # what may wait for a conversation's client (about 24 s of audio): a client
    # that stops reading is closed once more waits, so it cannot hold the server's memory or stall others
    socket_send_buffer: int = 262144  # the kernel's send buffer per conversation socket, fixed (unset, Linux grows
    # it to megabytes for a client that does not read): with the queue, what a session can hold is bounded


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


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def create_app(bundles: dict[str, TTSBundle], config: ServeConfig | None = None, llm_factory=None) -> web.Application:
    """bundles: model name ("s5", "t5") -> its loaded voice; llm_factory: () -> a new LLM backend per
    conversation (needed for /ws)."""
    config = config or ServeConfig()
    sessions = asyncio.Semaphore(config.max_sessions) if config.max_sessions > 0 else None
    app = web.Application(client_max_size=64 * 1024, middlewares=[_auth(config.token)] if config.token else [])
    worker = StreamWorker(config.worker_threads) if config.batch_decode else None  # one for every voice and
    # session, passed to each synthesizer: two threads of their own would fight over the cores

    async def worker_threads(app: web.Application) -> None:
        # each live session runs its engine's work on a thread of its own: the default pool (cores + 4) would
        # queue the sessions past it, and a batch waits only for the sessions whose work is running
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max(8, config.max_sessions + 4)))

    app.on_startup.append(worker_threads)
    if worker is not None:
        async def stop_worker(app: web.Application) -> None:
            worker.close()

        app.on_cleanup.append(stop_worker)
    if sessions is not None:
        app[SESSIONS] = sessions
    active = {"n": 0}
    metrics = ServerMetrics(lambda: worker.live_streams if worker is not None else active["n"])

    revoiced: dict[tuple[str, str], TTSBundle] = {}

    def voiced(model: str, vocoder: str) -> TTSBundle:
        """A model voiced by another vocoder, made on first request (the model's weights shared)."""
        if (model, vocoder) not in revoiced:
            revoiced[model, vocoder] = bundles[model].with_vocoder(vocoder)
        return revoiced[model, vocoder]

    async def health(request: web.Request) -> web.Response:
        models = sorted(bundles) + [alias for alias, model in MODEL_ALIASES.items() if model in bundles]
        return web.json_response({"status": "ok", "models": models, "voices": list(VOICES + OPENAI_VOICES),
                                  "sessions": active["n"], "max_sessions": config.max_sessions})

    async def speech(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return error(400, "the body must be JSON: {\"model\": ..., \"input\": ...}")
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        model, text = body.get("model", "s5"), body.get("input")
        model = MODEL_ALIASES.get(model, model)
        voice, response_format = body.get("voice", "default"), body.get("response_format", "mp3")
        vocoder, stream_format = body.get("vocoder", "default"), body.get("stream_format", "audio")
        if vocoder not in VOCODERS:
            return error(400, f"unknown vocoder {vocoder!r}; valid: {', '.join(VOCODERS)}")
        if model not in bundles:
            return error(400, f"unknown model {model!r}; valid: {', '.join(sorted(bundles) + list(MODEL_ALIASES))}")
        if voice not in VOICES + OPENAI_VOICES:
            return error(400, f"unknown voice {voice!r}; valid: {', '.join(VOICES + OPENAI_VOICES)}")
        if stream_format not in ("audio", "sse"):
            return error(400, f"unknown stream_format {stream_format!r}; valid: audio, sse")
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
            metrics.refused.labels("speech").inc()
            return error(503, f"busy: {config.max_sessions} requests are being spoken; try again shortly")
        async with sessions:
            active["n"] += 1
            metrics.opened.labels("speech").inc()
            try:
                bundle = bundles[model] if vocoder == "default" else voiced(model, vocoder)
                return await _stream(request, bundle, model, words, response_format, config.turn.synthesis, worker,
                                     sse=stream_format == "sse", on_done=metrics.speech)
            finally:
                active["n"] -= 1

    async def conversation(request: web.Request) -> web.WebSocketResponse:
        if llm_factory is None:
            return error(404, "this server has no LLM: conversations are off")
        if sessions is None or sessions.locked():
            metrics.refused.labels("conversation").inc()
            return error(503, f"busy: {config.max_sessions} sessions at once; try again shortly")
        ws = web.WebSocketResponse(max_msg_size=64 * 1024, heartbeat=30)
        await ws.prepare(request)
        async with sessions:
            active["n"] += 1
            metrics.opened.labels("conversation").inc()
            try:
                await _converse(request, ws, bundles, llm_factory, config, worker, metrics)
            finally:
                active["n"] -= 1
        return ws

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(body=metrics.text(), headers={"Content-Type": metrics.content_type})

    async def page(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    app.router.add_get("/", page)
    app.router.add_get("/health", health)
    app.router.add_get("/ws", conversation)
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/metrics", metrics_page)
    return app


async def _stream(request: web.Request, bundle: TTSBundle, model: str, words: list[str], response_format: str,
                  synthesis: SynthesisConfig, worker: StreamWorker | None, sse: bool = False, on_done=None):
    """Speak `words` into the response, encoded as `response_format`, each piece as soon as it is made; with
    `sse`, as OpenAI's server-sent events (`speech.audio.delta` with base64 audio, then `speech.audio.done`)."""
    rate = bundle.codec.sample_rate
    sink = QueueSink(rate)
    encoder = Encoder(response_format, rate)
    synth = StreamingSynthesizer(bundle, "s5" if model == "s5" else "t5", replace(synthesis, seed=0), max_stretch=1.0,
                                 worker=worker)
    speech = Speech(synth, sink)
    speaking = asyncio.create_task(speech.run(words))
    # a synthesis that fails ends the stream too (the writer below must not wait for audio that never comes)
    speaking.add_done_callback(lambda task: task.cancelled() or task.exception() is None or sink.queue.put_nowait(None))
    content_type = "text/event-stream" if sse else encoder.content_type
    response = web.StreamResponse(headers={"Content-Type": content_type, "X-Sample-Rate": str(rate)})
    await response.prepare(request)

    async def send(data: bytes) -> None:
        if not data:
            return
        if sse:
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
            data = f"data: {json.dumps(event)}\n\n".encode()
        await response.write(data)

    try:
        while (samples := await sink.queue.get()) is not None:
            await send(encoder.encode(samples))
        result = await speaking  # a synthesis failure surfaces (the client sees a cut stream; the log has it)
        if on_done is not None:
            on_done(result)
        await send(encoder.finish())
        if sse:
            usage = {"input_tokens": len(words), "output_tokens": 0, "total_tokens": len(words)}
            await response.write(f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode())
    finally:
        speaking.cancel()  # a client that went away stops the synthesis
    await response.write_eof()
    return response


async def _converse(request: web.Request, ws: web.WebSocketResponse, bundles: dict[str, TTSBundle], llm_factory,
                    config: ServeConfig, worker: StreamWorker | None, metrics: ServerMetrics) -> None:
    """The aiohttp adapter of one conversation (`session.Conversation`): socket messages in; its events and audio
    out through a bounded queue and one writer, so a client that stops reading is closed with a reason instead
    of holding memory, and never stalls another session."""
    outbox: asyncio.Queue = asyncio.Queue()
    waiting = {"bytes": 0}  # what the outbox holds
    stalled = asyncio.Event()
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    if sock is not None and config.socket_send_buffer:
        import socket

        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, config.socket_send_buffer)

    def enqueue(kind: str, payload) -> None:
        if stalled.is_set():
            return
        size = len(payload) if kind == "bytes" else 64
        if waiting["bytes"] + size > config.send_queue_bytes:
            stalled.set()
            return
        waiting["bytes"] += size
        outbox.put_nowait((kind, payload, size))

    async def write() -> None:
        while True:
            kind, payload, size = await outbox.get()
            await (ws.send_json(payload) if kind == "json" else ws.send_bytes(payload))
            waiting["bytes"] -= size

    conversation = Conversation(bundles, llm_factory, config.turn, worker, lambda event: enqueue("json", event),
                                lambda samples: enqueue("bytes", pcm16(samples)), config.max_input_chars,
                                on_turn=metrics.turn)
    writer = asyncio.create_task(write())
    conversation.ready()
    try:
        while True:
            receiving = asyncio.create_task(ws.receive(timeout=config.idle_timeout_s))
            stall = asyncio.create_task(stalled.wait())
            try:
                done, _ = await asyncio.wait({receiving, stall, writer}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:  # the server is shutting down
                receiving.cancel()
                raise
            finally:
                stall.cancel()
            if receiving not in done:
                receiving.cancel()
                reason = "the client stopped reading" if stalled.is_set() else "the connection failed"
                await _close(request, ws, WSCloseCode.POLICY_VIOLATION, reason)
                break
            try:
                message = receiving.result()
            except asyncio.TimeoutError:
                enqueue("json", {"type": "error", "message": f"idle for {config.idle_timeout_s:.0f} s: closing"})
                await asyncio.sleep(0.05)  # let the writer send it
                await _close(request, ws, WSCloseCode.GOING_AWAY, "idle")
                break
            if message.type in (web.WSMsgType.CLOSE, web.WSMsgType.CLOSING, web.WSMsgType.CLOSED, web.WSMsgType.ERROR):
                break
            if message.type == web.WSMsgType.BINARY:
                await conversation.receive(message.data)
            elif message.type == web.WSMsgType.TEXT:
                try:
                    data = json.loads(message.data)
                except ValueError:
                    data = None
                await conversation.receive(data if isinstance(data, dict) else {})
    finally:
        await conversation.close()
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def _close(request: web.Request, ws: web.WebSocketResponse, code: int, reason: str) -> None:
    """Close with a reason; a client that reads nothing cannot take the close frame either: then drop it."""
    try:
        await asyncio.wait_for(ws.close(code=code, message=reason.encode()), 1.0)
    except (asyncio.TimeoutError, ConnectionError):
        if request.transport is not None:
            request.transport.abort()


def _auth(token: str):
    @web.middleware
    async def check(request: web.Request, handler):
        # a browser cannot set headers on a WebSocket: /ws may carry the token as ?token=; compared in constant
        # time, so the time a refusal takes says nothing about how much of a guess was right
        expected = f"Bearer {token}".encode()
        header = request.headers.get("Authorization", "").encode()
        query = f"Bearer {request.query.get('token', '')}".encode()
        given = hmac.compare_digest(header, expected) | hmac.compare_digest(query, expected)
        if request.path not in ("/", "/health") and not given:
            return error(401, "missing or wrong bearer token")
        return await handler(request)

    return check
