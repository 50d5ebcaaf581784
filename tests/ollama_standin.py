"""A local stand-in for an Ollama server (none can be installed here) that speaks its documented NDJSON protocol:
POST /api/chat (streamed message objects, a final object with timing fields, or an {"error": ...} object) and
GET /api/tags. The model name picks the behaviour: `llama3.3:70b` streams normally, `slow` waits between pieces,
`error-mid` sends an error object mid-stream, `disconnect` drops the connection mid-stream, `thinker` streams
thinking text first, `story` streams a reply of about 45 words (some 13 s of speech); any other model is not
pulled (404)."""
from __future__ import annotations

import asyncio
import json
import socket
from datetime import datetime, timezone

from aiohttp import web

REQUESTS = web.AppKey("requests", list)
REPLY = ["Sure", ",", " the", " capital", " of", " France", " is", " Paris", "."]
STORY = ("Once upon a time a small robot lived in a lighthouse by the sea. Every night it climbed the stairs, "
         "cleaned the great lamp and counted the ships that passed. One winter a storm broke the lamp, and the robot "
         "held its own light up until morning came.").split(" ")
PULLED = ["llama3.3:70b", "slow", "error-mid", "disconnect", "thinker", "story"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _part(model: str, content: str = "", thinking: str | None = None, done: bool = False) -> bytes:
    message = {"role": "assistant", "content": content}
    if thinking is not None:
        message["thinking"] = thinking
    part = {"model": model, "created_at": datetime.now(timezone.utc).isoformat(), "message": message, "done": done}
    if done:
        part.update(done_reason="stop", total_duration=912_000_000, load_duration=12_000_000, prompt_eval_count=26,
                    prompt_eval_duration=130_000_000, eval_count=len(REPLY), eval_duration=700_000_000)
    return (json.dumps(part) + "\n").encode()


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    model = body.get("model", "")
    request.app[REQUESTS].append(body)
    if model not in PULLED:
        return web.json_response({"error": f"model '{model}' not found"}, status=404)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    if not body.get("messages"):  # a load request: just the final object
        await response.write(_part(model, done=True))
        return response
    if model == "thinker":
        for piece in ["Let me", " think", "."]:
            await response.write(_part(model, thinking=piece))
        await response.write(_part(model, "<think>hidden</think>"))
    for i, piece in enumerate([" " * (i > 0) + w for i, w in enumerate(STORY)] if model == "story" else REPLY):
        if model == "slow":
            await asyncio.sleep(0.05)
        if model == "error-mid" and i == 4:
            await response.write((json.dumps({"error": "an error was encountered while running the model: out of memory"}) + "\n").encode())
            return response
        if model == "disconnect" and i == 4:
            request.transport.close()  # the server goes away mid-reply
            return response
        await response.write(_part(model, piece))
    await response.write(_part(model, done=True))
    return response


async def tags(request: web.Request) -> web.Response:
    return web.json_response({"models": [{"name": m, "model": m, "modified_at": "2026-11-01T10:00:00Z", "size": 1,
                                          "digest": "0" * 64, "details": {"format": "gguf"}} for m in PULLED]})


async def start(port: int) -> web.AppRunner:
    app = web.Application()
    app[REQUESTS] = []
    app.router.add_post("/api/chat", chat)
    app.router.add_get("/api/tags", tags)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner
