"""The ASGI adapter of the server's transport-free core (`agent/serve/service.py`): the same routes as the aiohttp
server (`server.py`) on Starlette, for Ray Serve's ingress (`ray_serve.py`), where each replica builds one.

    GET  /                   the browser page
    GET  /health             the replica's health (with "replica" and "pid": which one answered)
    GET  /ws                 a conversation; a refused one (busy, draining) is accepted, told why in an "error"
                             event and closed with 1013 (try again later), since not every ASGI server can send an
                             HTTP status in place of the upgrade
    POST /v1/audio/speech    OpenAI's speech endpoint

There is no /metrics route: behind Ray's proxy each scrape would reach one replica; the metrics go through Ray's
metric API instead (`ray_serve.RayMetrics`). The token is checked as the aiohttp server checks it.

Threads: the event loop of the replica owns the service.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from agent.serve.service import STATIC, RequestError, VoiceService, bearer_ok, parse_text_message

if TYPE_CHECKING:
    from starlette.applications import Starlette

CLOSE_TRY_AGAIN = 1013


def create_asgi_app(service: VoiceService) -> Starlette:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    token = service.config.token

    def refused(status: int, message: str) -> Response:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    def authorised(headers, query) -> bool:
        return not token or bearer_ok(token, headers.get("authorization", ""), query.get("token", ""))

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def health(request: Request) -> Response:
        return JSONResponse(service.health())

    async def speech(request: Request) -> Response:
        if not authorised(request.headers, request.query_params):
            return refused(401, "missing or wrong bearer token")
        body = await request.body()
        if len(body) > 64 * 1024:
            return refused(413, "the body is larger than 64 KiB")
        try:
            spoken = service.speech_request(json.loads(body))
        except (ValueError, UnicodeDecodeError):
            return refused(400, "the body must be JSON: {\"model\": ..., \"input\": ...}")
        except RequestError as error:
            return refused(error.status, error.message)
        try:
            give_back = service.take_slot("speech")
        except RequestError as error:
            return refused(error.status, error.message)

        async def audio():
            pieces = service.speak(spoken)
            try:
                async for data in pieces:
                    yield data
            finally:
                await pieces.aclose()  # a client that went away stops the synthesis
                give_back()

        return StreamingResponse(audio(), media_type=spoken.content_type,
                                 headers={"X-Sample-Rate": str(spoken.bundle.codec.sample_rate)})

    async def conversation(websocket: WebSocket) -> None:
        if not authorised(websocket.headers, websocket.query_params):
            await websocket.close(code=1008, reason="missing or wrong bearer token")
            return
        await websocket.accept()
        try:
            give_back = service.take_slot("conversation") if service.llm_factory else None
        except RequestError as error:
            await websocket.send_json({"type": "error", "message": error.message})
            await websocket.close(code=CLOSE_TRY_AGAIN, reason=error.message[:120])
            return
        if give_back is None:
            await websocket.send_json({"type": "error", "message": "this server has no LLM: conversations are off"})
            await websocket.close(code=1008)
            return

        async def receive() -> dict | bytes | None:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return None
            if message.get("bytes") is not None:
                return message["bytes"]
            return parse_text_message(message.get("text") or "")

        try:
            closing = await service.converse(receive, websocket.send_json, websocket.send_bytes)
            if closing is not None:
                await websocket.close(code=closing.code, reason=closing.reason)
        except (WebSocketDisconnect, RuntimeError):  # the client went away while we wrote
            pass
        finally:
            give_back()

    return Starlette(routes=[Route("/", page), Route("/health", health),
                             Route("/v1/audio/speech", speech, methods=["POST"]),
                             WebSocketRoute("/ws", conversation)])

