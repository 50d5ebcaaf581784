"""`s5 serve` on a real loopback port (aiohttp's test server and client): health, streamed speech, errors, limits."""
import asyncio
import io
import wave

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from agent.serve.server import SERVICE, ServeConfig, create_app


@pytest.fixture(scope="module")
def bundles(tiny_bundle):
    return {"s5": tiny_bundle(2), "t5": tiny_bundle(None)}


def call(bundles, requests, config: ServeConfig | None = None, hold_sessions: bool = False, llm_factory=None):
    """Start a server, run `requests(client)`, stop it."""

    async def run():
        app = create_app(bundles, config, llm_factory)
        async with TestClient(TestServer(app)) as client:
            if hold_sessions:  # every session busy, as if other clients were being answered
                app[SERVICE].active = config.max_sessions
            return await requests(client)

    return asyncio.run(run())


def test_health_and_a_whole_wav(bundles):
    async def requests(client):
        health = await (await client.get("/health")).json()
        response = await client.post("/v1/audio/speech", json={"model": "s5", "input": "Hello there, how are you?",
                                                                "response_format": "wav"})
        return health, response.status, response.headers, await response.read()

    health, status, headers, body = call(bundles, requests)
    assert health["status"] == "ok" and health["models"][:2] == ["s5", "t5"] and "tts-1" in health["models"]
    assert {"default", "alloy", "nova"} <= set(health["voices"])
    assert status == 200 and headers["Content-Type"] == "audio/wav"
    rate = int(headers["X-Sample-Rate"])
    with wave.open(io.BytesIO(body)) as f:  # its header states its true length: any WAV reader reads it whole
        assert (f.getframerate(), f.getnchannels(), f.getsampwidth()) == (rate, 1, 2)
        samples = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
        assert f.getnframes() == (len(body) - 44) // 2
    assert len(samples) > rate // 10 and np.abs(samples).max() > 0


def test_pcm_and_t5(bundles):
    async def requests(client):
        response = await client.post("/v1/audio/speech", json={"model": "t5", "input": "Good morning.", "response_format": "pcm"})
        return response.status, response.headers["Content-Type"], await response.read()

    status, kind, body = call(bundles, requests)
    assert status == 200 and kind == "audio/pcm" and len(body) > 0 and len(body) % 2 == 0


@pytest.mark.parametrize("payload,status,says", [
    ({"model": "s7", "input": "hi"}, 400, "s5, t5, tts-1"),
    ({"model": "s5", "input": "hi", "voice": "robot"}, 400, "valid: default, alloy"),
    ({"model": "s5", "input": "hi", "response_format": "ogg"}, 400, "mp3, opus, aac, flac, wav, pcm"),
    ({"model": "s5", "input": "hi", "stream_format": "chunks"}, 400, "audio, sse"),
    ({"model": "s5", "input": "   "}, 400, "empty"),
    ({"model": "s5", "input": "😀😀"}, 400, "nothing speakable"),
    ({"model": "s5", "input": "word " * 2000}, 400, "at most 4096"),
    ({"model": "s5", "input": "hi", "speed": 2}, 400, "speed"),
    ({"model": "s5", "input": "hi", "vocoder": "bigvgan"}, 400, "default, universal"),
])
def test_bad_requests_get_a_400_that_says_why(bundles, payload, status, says):
    async def requests(client):
        response = await client.post("/v1/audio/speech", json=payload)
        return response.status, await response.json()

    got, body = call(bundles, requests)
    assert got == status and says in body["error"]["message"]


def test_a_request_can_ask_for_the_reference_vocoder(bundles):
    """"vocoder": "universal" voices the same codes with HiFi-GAN V1: as long (but for the leading silence each
    drops), not the same samples."""
    async def requests(client):
        bodies = []
        for vocoder in ("default", "universal"):
            response = await client.post("/v1/audio/speech", json={"input": "Good morning, friend.", "vocoder": vocoder,
                                                                   "response_format": "pcm"})
            bodies.append(np.frombuffer(await response.read(), np.int16))
        return bodies

    default, universal = call(bundles, requests)
    assert len(default) > 0 and len(universal) > 0 and abs(len(default) - len(universal)) < 22050 // 2
    assert not np.array_equal(default[: len(universal)], universal[: len(default)])


def test_busy_is_a_503_at_once_and_a_token_is_enforced(bundles):
    async def busy(client):
        response = await client.post("/v1/audio/speech", json={"input": "hi there"})
        return response.status, await response.json()

    status, body = call(bundles, busy, ServeConfig(max_sessions=1), hold_sessions=True)
    assert status == 503 and "busy" in body["error"]["message"]

    async def guarded(client):
        anonymous = await client.post("/v1/audio/speech", json={"input": "hi there"})
        health = await client.get("/health")  # the load balancer's check needs no token
        allowed = await client.post("/v1/audio/speech", json={"input": "hi there"}, headers={"Authorization": "Bearer s3cret"})
        await allowed.read()
        return anonymous.status, health.status, allowed.status

    assert call(bundles, guarded, ServeConfig(token="s3cret")) == (401, 200, 200)


def test_two_requests_at_once_get_their_own_audio(bundles):
    """Concurrent sessions do not mix: each stream equals the same request made alone."""
    texts = ["Hello there, this is the first voice.", "And a second, different sentence follows here."]

    async def one(client, text):
        response = await client.post("/v1/audio/speech", json={"input": text, "response_format": "pcm"})
        return await response.read()

    async def alone(client):
        return [await one(client, t) for t in texts]

    async def together(client):
        return list(await asyncio.gather(*(one(client, t) for t in texts)))

    # the same speech, sample for sample; when each chunk left may differ (the opening leaves as soon as it can),
    # and with it the float rounding of a sample (1e-7): at most one step of 16-bit PCM
    for mixed, single in zip(call(bundles, together), call(bundles, alone), strict=True):
        mixed, single = np.frombuffer(mixed, np.int16).astype(int), np.frombuffer(single, np.int16).astype(int)
        assert len(mixed) == len(single) and np.abs(mixed - single).max() <= 1


def test_spread_clients_start_apart_each_at_its_own_sentence():
    """`s5 bench serve --spread`: client i starts at sentence i (the list wraps) and i / n of a second after the
    first; by default all start at once with the same list, in step."""
    from agent.bench.serve import SPREAD_S, client_plans

    texts = ["One.", "Two.", "Three."]
    assert client_plans(texts, 2, spread=False) == [(0.0, texts), (0.0, texts)]
    plans = client_plans(texts, 4, spread=True)
    assert [delay for delay, _ in plans] == [0.0, SPREAD_S / 4, SPREAD_S / 2, 3 * SPREAD_S / 4]
    assert [order[0] for _, order in plans] == ["One.", "Two.", "Three.", "One."]
    assert all(sorted(order) == sorted(texts) for _, order in plans)  # every client speaks every sentence


def test_bench_serve_reports_each_session_count(bundles, tmp_path):
    from agent.bench.serve import bench_serve

    result = asyncio.run(bench_serve(bundles, ["Hello there.", "How are you today?"], [1, 2], spread=True))
    assert [r["sessions"] for r in result["runs"]] == [1, 2] and result["batch_decode"] and result["spread"]
    assert result["streams_real_time"] in (0, 1, 2)
    for run in result["runs"]:  # every session of every run spoke, and was timed as a listener would time it
        assert run["errors"] == 0 and 0 < run["first_audible_ms_p50"] <= run["first_audible_ms_p95"]
        assert run["rtf"] > 0 and run["cpu_s_per_audio_s"] > 0 and run["underruns"] >= 0
        assert run["render_ms_per_audio_s"] > 0 and run["decode_ms_per_audio_s"] > 0  # the worker decoded and
        # rendered what was heard
        assert list(run["opening_ms"]) == ["to_first_frame", "decoding", "rendering", "to_chunk"]
        assert all(0 <= p50 <= p95 for p50, p95 in run["opening_ms"].values())
    from agent.bench.plots import plot_serve
    from tests.agent.test_say import assert_a_drawn_png

    assert_a_drawn_png(plot_serve(result["runs"], tmp_path / "serve.png"))


def test_a_conversation_over_the_websocket_streams_text_audio_and_records(bundles):
    from aiohttp import WSMsgType

    from llm.replay import ReplayLLM, ReplayScript

    def llm():
        return ReplayLLM(ReplayScript.from_dict({"name": "ws", "llm": {"first_token_ms": 10, "tokens_per_second": 200},
                                                 "turns": [{"user": "a", "assistant": "Hello from the server."},
                                                           {"user": "b", "assistant": "Second answer here."}]}))

    async def converse(client):
        ws = await client.ws_connect("/ws")
        ready = await ws.receive_json()
        await ws.send_str("not json")
        problem = await ws.receive_json()
        await ws.send_json({"type": "settings", "mode": "t5"})
        await ws.send_json({"type": "user", "text": "hi"})
        text, audio, record, words = "", b"", None, []
        while record is None:
            message = await ws.receive()
            if message.type == WSMsgType.BINARY:
                audio += message.data
            elif message.json()["type"] == "text":
                text += message.json()["text"]
            elif message.json()["type"] == "word":
                words.append((message.json(), len(audio) // 2))  # with the samples received before it
            elif message.json()["type"] == "record":
                record = message.json()["record"]
        await ws.close()
        return ready, problem, text, audio, record, words

    ready, problem, text, audio, record, words = call(bundles, converse, llm_factory=llm)
    assert [w["word"] for w, _ in words] == ["Hello", "from", "the", "server."]
    for word, received in words:  # each word no later than the audio that holds its start
        assert received <= word["start_s"] * ready["sample_rate"] + 1 and word["end_s"] >= word["start_s"]
    assert ready["type"] == "ready" and ready["sample_rate"] > 0
    assert problem["type"] == "error"
    assert text == "Hello from the server." and record["reply"] == text and record["tts_mode"] == "t5"
    assert record["error"] is None and len(audio) > 0 and len(audio) // 2 / ready["sample_rate"] == pytest.approx(record["audio_s"], rel=0.05)


def test_the_browser_page_is_served(bundles):
    async def requests(client):
        response = await client.get("/")
        return response.status, response.headers["Content-Type"], await response.text()

    status, kind, page = call(bundles, requests, ServeConfig(token="t"))  # the page needs no token; /ws does
    assert status == 200 and kind.startswith("text/html") and "AudioWorklet" in page and "/ws" in page


def test_an_idle_conversation_is_closed_and_frees_its_slot(bundles):
    from llm.replay import ReplayLLM, ReplayScript

    def llm():
        return ReplayLLM(ReplayScript.from_dict({"name": "idle", "turns": [{"user": "a", "assistant": "b"}]}))

    async def idle(client):
        ws = await client.ws_connect("/ws")
        ready = await ws.receive_json()
        notice = await ws.receive_json()  # nothing sent: the server gives up after the timeout
        closed = await ws.receive()
        for _ in range(100):  # the server's handler finishes just after the close
            health = await (await client.get("/health")).json()
            if health["sessions"] == 0:
                break
            await asyncio.sleep(0.02)
        return ready["type"], notice, closed.type, health["sessions"]

    from aiohttp import WSMsgType

    kind, notice, closed, sessions = call(bundles, idle, ServeConfig(idle_timeout_s=0.3), llm_factory=llm)
    assert kind == "ready" and "idle" in notice["message"] and closed == WSMsgType.CLOSE and sessions == 0


class RecordingReplay:
    """A replayed LLM that remembers the messages each turn was asked with."""

    def __new__(cls, turns):
        from llm.replay import ReplayLLM, ReplayScript

        llm = ReplayLLM(ReplayScript.from_dict({"name": "rec", "llm": {"first_token_ms": 5, "tokens_per_second": 400},
                                                "turns": turns}))
        llm.asked = []
        stream = llm.stream

        def remembering(messages):
            llm.asked.append(messages)
            return stream(messages)

        llm.stream = remembering
        return llm


def test_a_resumed_conversation_answers_with_the_history_the_client_kept(bundles):
    """The server lost the conversation (a lost replica, a restart); the client reconnects and sends the history it
    kept: the next turn's request carries it, and the server sends the history back after the turn."""
    made = []

    def llm():
        made.append(RecordingReplay([{"user": "What is my name?", "assistant": "Your name is Ana."}]))
        return made[-1]

    kept = [{"role": "user", "content": "My name is Ana."}, {"role": "assistant", "content": "Nice to meet you, Ana."}]

    async def reconnect(client):
        ws = await client.ws_connect("/ws")
        await ws.receive_json()  # ready
        await ws.send_json({"type": "resume", "history": [{"role": "robot", "content": 1}]})
        bad = await ws.receive_json()
        await ws.send_json({"type": "resume", "history": kept, "mode": "s5"})
        echoed = await ws.receive_json()
        await ws.send_json({"type": "user", "text": "What is my name?"})
        history = None
        while history is None or not any(m["content"] == "What is my name?" for m in history):
            message = await ws.receive()
            if message.type == WSMsgType.TEXT and message.json()["type"] == "history":
                history = message.json()["history"]
        await ws.close()
        return bad, echoed, history

    from aiohttp import WSMsgType

    bad, echoed, history = call(bundles, reconnect, llm_factory=llm)
    assert bad["type"] == "error" and "resume" in bad["message"]
    assert echoed == {"type": "history", "history": kept}
    asked = made[0].asked[0]
    assert asked[1:] == kept + [{"role": "user", "content": "What is my name?"}]  # after the system prompt
    assert history == kept + [{"role": "user", "content": "What is my name?"},
                              {"role": "assistant", "content": "Your name is Ana."}]


def test_metrics_count_sessions_and_first_sound_behind_the_token(bundles):
    async def requests(client):
        headers = {"Authorization": "Bearer tok"}
        await (await client.post("/v1/audio/speech", json={"input": "Hello there.", "response_format": "pcm"},
                                 headers=headers)).read()
        refused = (await client.get("/metrics")).status
        page = await (await client.get("/metrics", headers=headers)).text()
        return refused, page

    refused, page = call(bundles, requests, ServeConfig(token="tok"))
    assert refused == 401
    assert 's5_sessions_opened_total{kind="speech"} 1.0' in page
    assert 's5_first_audible_seconds_count{kind="speech"} 1.0' in page and "s5_live_streams 0.0" in page


async def silent_client(port: int, text: str):
    """A WebSocket client that sends one message and then never reads (small buffers, so it stalls soon)."""
    import base64
    import json
    import os
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1024)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    assert b"101" in await reader.readuntil(b"\r\n\r\n")
    payload, mask = json.dumps({"type": "user", "text": text}).encode(), os.urandom(4)
    writer.write(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    await writer.drain()
    return writer


def test_a_client_that_stops_reading_is_closed_and_stalls_no_one(bundles):
    """One client asks for a long reply and never reads; another converses meanwhile and gets its whole reply;
    the silent one is closed (its slot freed) once its socket buffer and the bytes it may have waiting are full.
    (A test of behaviour under load, not of speed: it waits for conditions, with generous bounds.)"""
    from agent.orchestrator import AgentConfig
    from tts.inference.synthesis import SynthesisConfig

    long_reply = " ".join(["This sentence keeps the audio coming for a while."] * 30)
    replies = iter([long_reply, "A short answer, spoken while the other one is stuck."])

    def llm():  # the silent client's conversation opens first: it gets the long reply
        return RecordingReplay([{"user": "Talk.", "assistant": next(replies)}])

    async def scenario(client):
        silent = await silent_client(client.server.port, "Talk.")
        live = await client.ws_connect("/ws")
        await live.send_json({"type": "user", "text": "Talk."})
        record = None
        while record is None:
            message = await live.receive()
            if message.type == WSMsgType.TEXT and message.json()["type"] == "record":
                record = message.json()["record"]
        for _ in range(200):
            sessions = (await (await client.get("/health")).json())["sessions"]
            if sessions == 1:  # only the live one is left
                break
            await asyncio.sleep(0.05)
        await live.close()
        silent.close()
        return record, sessions

    from aiohttp import WSMsgType

    config = ServeConfig(send_queue_bytes=65536, socket_send_buffer=16384,
                         turn=AgentConfig(synthesis=SynthesisConfig(max_frames_per_word=3)))
    record, sessions = call(bundles, scenario, config, llm_factory=llm)
    assert record["error"] is None and not record["cancelled"] and record["audio_s"] > 1
    assert sessions == 1


def test_five_hundred_idle_connections_leave_live_sessions_whole(bundles):
    """500 clients connected and idle (half sent half a request and stopped, half are keep-alive connections after
    a request) while a conversation and a speech request run: both complete whole, and the idle ones hold no
    session slot. How much they slow the live ones is a benchmark figure (`s5 bench serve --idle 500`)."""
    from aiohttp import WSMsgType

    def llm():
        return RecordingReplay([{"user": "Hi.", "assistant": "Five hundred others are waiting quietly."}])

    async def scenario(client):
        idle = []
        for i in range(500):
            reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
            if i % 2:
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the end of its headers
            else:
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                await reader.readuntil(b"}")  # answered; the connection stays open, idle
            idle.append(writer)
        await asyncio.gather(*(w.drain() for w in idle))
        live = await client.ws_connect("/ws")
        await live.send_json({"type": "user", "text": "Hi."})
        speech = client.post("/v1/audio/speech", json={"input": "The others wait.", "response_format": "pcm"})
        record, audio = None, b""
        async with await speech as response:
            audio = await response.read()
        while record is None:
            message = await live.receive()
            if message.type == WSMsgType.TEXT and message.json()["type"] == "record":
                record = message.json()["record"]
        sessions = (await (await client.get("/health")).json())["sessions"]
        await live.close()
        for writer in idle:
            writer.close()
        return record, len(audio), sessions

    record, speech_bytes, sessions = call(bundles, scenario, llm_factory=llm)
    assert record["error"] is None and record["reply"] == "Five hundred others are waiting quietly."
    assert speech_bytes > 0 and sessions == 1  # only the live conversation holds a slot


def test_bench_serve_asks_again_when_a_stream_is_cut_and_counts_the_reconnect():
    """A server whose first answer is cut mid-stream (as when a replica dies) and whose second is a 503 (as
    Ray's proxy answers while it has no replica): the client asks again each time and counts it."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from agent.bench.serve import bench_serve

    calls = {"n": 0}

    async def speech(request):
        calls["n"] += 1
        if calls["n"] == 2:
            return web.json_response({"error": {"message": "no replica"}}, status=503)
        response = web.StreamResponse(headers={"X-Sample-Rate": "22050"})
        await response.prepare(request)
        await response.write(np.full(2205, 1000, "<i2").tobytes())
        if calls["n"] == 1:
            request.transport.close()  # the replica died
            return response
        await response.write_eof()
        return response

    async def run():
        app = web.Application()
        app.router.add_post("/v1/audio/speech", speech)
        server = TestServer(app)
        await server.start_server()
        try:
            return await bench_serve(None, ["One sentence."], [1], url=str(server.make_url("")))
        finally:
            await server.close()

    run_ = asyncio.run(run())["runs"][0]
    assert run_["reconnects"] == 2 and run_["errors"] == 0 and calls["n"] == 3
