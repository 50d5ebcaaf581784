"""`s5 serve`: S5-TTS as a streaming speech server, the aiohttp adapter of the transport-free core
(`agent/serve/service.py`; Ray Serve's ASGI adapter is `agent/serve/asgi.py`, the same routes).

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

With `--token`, every route but the page and /health needs it (compared in constant time), the WebSocket upgrade
included. A conversation's client that stops reading is closed once `send_queue_bytes` wait for it. Errors are JSON
`{"error": {"message": ...}}` with a 4xx/5xx status.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from agent.serve.metrics import PrometheusMetrics
from agent.serve.service import (MODEL_ALIASES, OPEN_PATHS, OPENAI_VOICES, STATIC, VOCODERS, VOICES, RequestError,
                                 ServeConfig, VoiceService, bearer_ok, parse_text_message)
from tts.inference.synthesis import TTSBundle

__all__ = ["MODEL_ALIASES", "OPENAI_VOICES", "VOCODERS", "VOICES", "ServeConfig", "create_app"]
SERVICE = web.AppKey("service", VoiceService)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def create_app(bundles: dict[str, TTSBundle], config: ServeConfig | None = None, llm_factory=None) -> web.Application:
    """bundles: model name ("s5", "t5") -> its loaded voice; llm_factory: () -> a new LLM backend per
    conversation (needed for /ws)."""
    config = config or ServeConfig()
    app = web.Application(client_max_size=64 * 1024, middlewares=[_auth(config.token)] if config.token else [])
    metrics = PrometheusMetrics(lambda: service.live_streams)
    service = app[SERVICE] = VoiceService(bundles, config, llm_factory, metrics)

    async def worker_threads(app: web.Application) -> None:
        # each live session runs its engine's work on a thread of its own: the default pool (cores + 4) would
        # queue the sessions past it, and a batch waits only for the sessions whose work is running
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max(8, config.max_sessions + 4)))

    async def stop_worker(app: web.Application) -> None:
        service.close()

    app.on_startup.append(worker_threads)
    app.on_cleanup.append(stop_worker)

    async def health(request: web.Request) -> web.Response:
        return web.json_response(service.health())

    async def speech(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return error(400, "the body must be JSON: {\"model\": ..., \"input\": ...}")
        try:
            spoken = service.speech_request(body)
            async with service.slot("speech"):
                response = web.StreamResponse(headers={"Content-Type": spoken.content_type,
                                                       "X-Sample-Rate": str(spoken.bundle.codec.sample_rate)})
                await response.prepare(request)
                audio = service.speak(spoken)
                try:
                    async for data in audio:
                        await response.write(data)
                finally:
                    await audio.aclose()  # a client that went away stops the synthesis
                await response.write_eof()
                return response
        except RequestError as refused:
            return error(refused.status, refused.message)

    async def conversation(request: web.Request) -> web.StreamResponse:
        if llm_factory is None:
            return error(404, "this server has no LLM: conversations are off")
        try:
            async with service.slot("conversation"):
                ws = web.WebSocketResponse(max_msg_size=64 * 1024, heartbeat=30)
                await ws.prepare(request)
                _fix_send_buffer(request, config.socket_send_buffer)

                async def receive() -> dict | bytes | None:
                    message = await ws.receive()
                    if message.type == web.WSMsgType.BINARY:
                        return message.data
                    if message.type == web.WSMsgType.TEXT:
                        return parse_text_message(message.data)
                    return None  # closed, closing or failed

                closing = await service.converse(receive, ws.send_json, ws.send_bytes)
                if closing is not None:
                    await _close(request, ws, closing.code, closing.reason)
                return ws
        except RequestError as refused:
            return error(refused.status, refused.message)

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


def _fix_send_buffer(request: web.Request, size: int) -> None:
    sock = request.transport.get_extra_info("socket") if request.transport is not None else None
    if sock is not None and size:
        import socket

        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


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
        given = bearer_ok(token, request.headers.get("Authorization", ""), request.query.get("token", ""))
        if request.path not in OPEN_PATHS and not given:
            return error(401, "missing or wrong bearer token")
        return await handler(request)

    return check
