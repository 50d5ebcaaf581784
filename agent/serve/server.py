"""`s5 serve`: S5-TTS as a streaming speech server (aiohttp).

    GET  /                   a page to talk to it from a browser (type, hear the answer stream, switch s5/t5/sentence)
    GET  /health             {"status": "ok", "models": [...], "voices": [...], "sessions": n, "max_sessions": m}
    GET  /ws                 a conversation: one agent per connection. Client -> server JSON: {"type": "user",
                             "text": ...}, {"type": "settings", "mode": "s5"|"t5"|"sentence"}, {"type": "interrupt"}.
                             Binary client messages: the microphone, s16le at 16 kHz (VAD + Whisper, half-duplex).
                             Server -> client: binary s16le PCM at the codec's rate as it plays, and JSON events
                             {"type": "ready", "sample_rate"}, {"type": "text", "text"} (the LLM's pieces),
                             {"type": "heard", "text"} (what the microphone's speech was transcribed as),
                             {"type": "record", "record": {...}} (the turn's latency record), {"type": "error", "message"}
    POST /v1/audio/speech    OpenAI's speech endpoint: {"model": "s5"|"t5" (or OpenAI's "tts-1", "tts-1-hd",
                             "gpt-4o-mini-tts": S5), "input": text, "voice": "default" (or an OpenAI voice name:
                             the shipped voice), "response_format": mp3 (default)|opus|aac|flac|wav|pcm, "speed": 1.0,
                             "stream_format": "audio"|"sse", "vocoder": "default"|"universal"|"fast"}; the audio
                             streams as it is synthesised (`audio_formats.py`; X-Sample-Rate says pcm's rate)

Each request runs the one pipeline driver (`tts.inference.pipeline.Speech`) with its own synthesizer and sink;
the models are shared read-only, so nothing of one request is visible to another and replicas scale out behind
any load balancer that checks /health. Errors are JSON `{"error": {"message": ...}}` with a 4xx/5xx status.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
import base64
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from aiohttp import web

from audio_io.capture import CAPTURE_RATE, QueueMicrophone
from audio_io.sinks import ClockSink
from tts.frontend.text import normalize_text
from tts.inference.pipeline import Speech
from tts.inference.batching import StreamWorker
from tts.inference.streaming import MODES, StreamingSynthesizer
from tts.inference.synthesis import SynthesisConfig, TTSBundle

from agent.listen import HeardLine, Listener
from agent.serve.audio_formats import FORMATS, Encoder, pcm16
from agent.orchestrator import Agent, AgentConfig

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


class SocketSink(ClockSink):
    """A conversation's player: what it plays goes to the client as binary PCM frames, on the player clock."""

    def __init__(self, sample_rate: int, ws: web.WebSocketResponse):
        super().__init__(sample_rate, pace=True)
        self.ws = ws

    def _record(self, samples: np.ndarray) -> None:
        if not self.ws.closed:
            asyncio.ensure_future(self.ws.send_bytes(pcm16(samples)))

    def show_words(self, word_times) -> None:
        """Each word with its place in the reply's audio (seconds from its first sample), sent before that audio."""
        for word in word_times:
            if not self.ws.closed:
                asyncio.ensure_future(self.ws.send_json({"type": "word", **word.to_json()}))


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
            return error(503, f"busy: {config.max_sessions} requests are being spoken; try again shortly")
        async with sessions:
            active["n"] += 1
            try:
                bundle = bundles[model] if vocoder == "default" else voiced(model, vocoder)
                return await _stream(request, bundle, model, words, response_format, config.turn.synthesis, worker,
                                     sse=stream_format == "sse")
            finally:
                active["n"] -= 1

    async def conversation(request: web.Request) -> web.WebSocketResponse:
        if llm_factory is None:
            return error(404, "this server has no LLM: conversations are off")
        if sessions is None or sessions.locked():
            return error(503, f"busy: {config.max_sessions} sessions at once; try again shortly")
        ws = web.WebSocketResponse(max_msg_size=64 * 1024, heartbeat=30)
        await ws.prepare(request)
        async with sessions:
            active["n"] += 1
            try:
                await _converse(ws, bundles, llm_factory, config, worker)
            finally:
                active["n"] -= 1
        return ws

    async def page(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    app.router.add_get("/", page)
    app.router.add_get("/health", health)
    app.router.add_get("/ws", conversation)
    app.router.add_post("/v1/audio/speech", speech)
    return app


async def _stream(request: web.Request, bundle: TTSBundle, model: str, words: list[str], response_format: str,
                  synthesis: SynthesisConfig, worker: StreamWorker | None, sse: bool = False):
    """Speak `words` into the response, encoded as `response_format`, each piece as soon as it is made; with
    `sse`, as OpenAI's server-sent events (`speech.audio.delta` with base64 audio, then `speech.audio.done`)."""
    rate = bundle.codec.sample_rate
    sink = QueueSink(rate)
    encoder = Encoder(response_format, rate)
    synth = StreamingSynthesizer(bundle, "s5" if model == "s5" else "t5", replace(synthesis, seed=0), max_stretch=1.0,
                                 worker=worker)
    speaking = asyncio.create_task(Speech(synth, sink).run(words))
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
        await speaking  # a synthesis failure surfaces (the client sees a cut stream; the log has the traceback)
        await send(encoder.finish())
        if sse:
            usage = {"input_tokens": len(words), "output_tokens": 0, "total_tokens": len(words)}
            await response.write(f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n".encode())
    finally:
        speaking.cancel()  # a client that went away stops the synthesis
    await response.write_eof()
    return response


async def _converse(ws: web.WebSocketResponse, bundles: dict[str, TTSBundle], llm_factory, config: ServeConfig,
                    worker: StreamWorker | None) -> None:
    """One conversation: turns run one at a time; a new user line or an interrupt stops the one speaking."""
    tts = {"s5": bundles["s5"], "t5": bundles.get("t5", bundles["s5"]), "sentence": bundles.get("t5", bundles["s5"])}
    rate = bundles["s5"].codec.sample_rate
    llm = llm_factory()
    agent = Agent(llm, tts, SocketSink(rate, ws), replace(config.turn, synthesis=replace(config.turn.synthesis, seed=0)),
                  worker=worker,
                  on_piece=lambda text: asyncio.ensure_future(ws.send_json({"type": "text", "text": text})))
    await ws.send_json({"type": "ready", "sample_rate": rate, "modes": list(MODES), "microphone_rate": CAPTURE_RATE})
    turn: asyncio.Task | None = None
    microphone, hearing = QueueMicrophone(), None

    async def run(text: str, heard: HeardLine | None = None) -> None:
        record = await agent.run_turn(text, heard=heard)
        await ws.send_json({"type": "record", "record": record.to_json()})

    async def hear() -> None:
        """The browser's microphone: Silero VAD + Whisper, half-duplex as in `s5 chat --voice`."""
        nonlocal turn
        await Listener.warm_up()
        async for heard in Listener(microphone).lines():
            if turn is not None and not turn.done():
                continue  # the microphone hears the agent itself while it speaks
            await ws.send_json({"type": "heard", "text": heard.text})
            if heard.text:
                turn = asyncio.create_task(run(heard.text, heard))

    try:
        while True:
            try:
                message = await ws.receive(timeout=config.idle_timeout_s)
            except asyncio.TimeoutError:
                await ws.send_json({"type": "error", "message": f"idle for {config.idle_timeout_s:.0f} s: closing"})
                await ws.close()
                break
            if message.type in (web.WSMsgType.CLOSE, web.WSMsgType.CLOSING, web.WSMsgType.CLOSED, web.WSMsgType.ERROR):
                break
            if message.type == web.WSMsgType.BINARY:  # microphone: s16le at CAPTURE_RATE
                hearing = hearing or asyncio.create_task(hear())
                microphone.feed(np.frombuffer(message.data[: len(message.data) // 2 * 2], "<i2").astype(np.float32) / 32768)
                continue
            if message.type != web.WSMsgType.TEXT:
                continue
            try:
                data = message.json()
                kind = data["type"]
            except (ValueError, KeyError, TypeError):
                await ws.send_json({"type": "error", "message": "messages are JSON objects with a \"type\""})
                continue
            if kind == "settings":
                if data.get("mode") not in MODES:
                    await ws.send_json({"type": "error", "message": f"mode: one of {', '.join(MODES)}"})
                else:
                    agent.config.tts_mode = data["mode"]
            elif kind in ("user", "interrupt"):
                if turn is not None and not turn.done():
                    agent.interrupt()
                    await turn
                text = str(data.get("text", ""))
                if kind == "user" and text.strip():
                    if len(text) > config.max_input_chars:
                        await ws.send_json({"type": "error", "message": f"text: at most {config.max_input_chars} characters"})
                    else:
                        turn = asyncio.create_task(run(text))
            else:
                await ws.send_json({"type": "error", "message": f"unknown message type {kind!r}"})
    finally:
        if hearing is not None:
            hearing.cancel()
        if turn is not None and not turn.done():
            agent.interrupt()
            await asyncio.gather(turn, return_exceptions=True)
        await llm.close()


def _auth(token: str):
    @web.middleware
    async def check(request: web.Request, handler):
        # a browser cannot set headers on a WebSocket: /ws may carry the token as ?token=
        given = request.headers.get("Authorization") == f"Bearer {token}" or request.query.get("token") == token
        if request.path not in ("/", "/health") and not given:
            return error(401, "missing or wrong bearer token")
        return await handler(request)

    return check
