"""The ASGI adapter (what each Ray replica serves) over the same core as the aiohttp server, through Starlette's
own test client: the same routes, errors and token; a conversation; busy and draining closes."""
import io
import wave

import pytest

from agent.serve.service import ServeConfig, VoiceService

starlette = pytest.importorskip("starlette", reason="the ASGI adapter runs on Starlette (s5-agent[cluster])")


class CountingMetrics:
    """The calls a metrics backend receives (the Ray backend needs a Ray replica around it)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


@pytest.fixture(scope="module")
def bundles(tiny_bundle):
    return {"s5": tiny_bundle(2), "t5": tiny_bundle(None)}


def llm_factory(reply: str = "Hello from a replica."):
    from llm.replay import ReplayLLM, ReplayScript

    def new():
        return ReplayLLM(ReplayScript.from_dict({"name": "asgi", "llm": {"first_token_ms": 10, "tokens_per_second": 200},
                                                 "turns": [{"user": "a", "assistant": reply}]}))
    return new


def client_for(bundles, config: ServeConfig | None = None, llm=None):
    from starlette.testclient import TestClient

    from agent.serve.asgi import create_asgi_app

    metrics = CountingMetrics()
    service = VoiceService(bundles, config or ServeConfig(), llm, metrics, replica="r1")
    return TestClient(create_asgi_app(service)), service, metrics


def test_speech_health_errors_and_the_token_as_the_aiohttp_server_has_them(bundles):
    client, service, metrics = client_for(bundles, ServeConfig(token="tok"))
    with client:
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["replica"] == "r1" and "tts-1" in health["models"]
        assert client.get("/").status_code == 200  # the page needs no token
        body = {"model": "tts-1", "voice": "alloy", "input": "Hello there, replica.", "response_format": "wav"}
        assert client.post("/v1/audio/speech", json=body).status_code == 401
        reply = client.post("/v1/audio/speech", json=body, headers={"Authorization": "Bearer tok"})
        assert reply.status_code == 200 and reply.headers["content-type"] == "audio/wav"
        with wave.open(io.BytesIO(reply.content)) as wav:
            assert wav.getnframes() > 0.3 * wav.getframerate()
        bad = client.post("/v1/audio/speech", json={**body, "voice": "nobody"}, headers={"Authorization": "Bearer tok"})
        assert bad.status_code == 400 and "unknown voice 'nobody'" in bad.json()["error"]["message"]
        broken = client.post("/v1/audio/speech", content=b"{not json", headers={"Authorization": "Bearer tok"})
        assert broken.status_code == 400
    assert ("opened", "speech") in metrics.calls and any(call[0] == "speech" for call in metrics.calls)
    service.close()


def test_a_conversation_streams_and_a_full_replica_says_so_and_closes_with_try_again(bundles):
    from starlette.websockets import WebSocketDisconnect

    client, service, metrics = client_for(bundles, ServeConfig(max_sessions=1), llm_factory())
    with client, client.websocket_connect("/ws") as ws:
        assert ws.receive_json()["type"] == "ready"
        ws.send_json({"type": "user", "text": "hi"})
        audio, record, words = 0, None, []
        while record is None:
            message = ws.receive()
            if message.get("bytes") is not None:
                audio += len(message["bytes"])
            elif (event := __import__("json").loads(message["text"]))["type"] == "record":
                record = event["record"]
            elif event["type"] == "word":
                words.append(event["word"])
        assert record["reply"] == "Hello from a replica." and record["error"] is None and audio > 0
        assert words == ["Hello", "from", "a", "replica."]
        with client.websocket_connect("/ws") as second:  # the one slot is taken
            assert "busy" in second.receive_json()["message"]
            with pytest.raises(WebSocketDisconnect) as closed:
                second.receive_json()
            assert closed.value.code == 1013
    assert ("refused", "conversation") in metrics.calls
    service.close()


def test_a_draining_replica_finishes_the_reply_then_closes_with_restart(bundles):
    """Ray stops a replica (scale-down, redeploy): the reply being spoken is sent whole, then the conversation is
    closed with 1012 so that its client reconnects elsewhere and resumes; new sessions are refused."""
    import json

    from starlette.websockets import WebSocketDisconnect

    client, service, _ = client_for(bundles, ServeConfig(), llm_factory("A reply long enough to be draining in it."))
    with client, client.websocket_connect("/ws") as ws:
        ws.receive_json()
        ws.send_json({"type": "user", "text": "hi"})
        seen, code = [], None
        try:
            while True:
                message = ws.receive()
                if message.get("bytes") is not None:
                    if not service.draining:
                        service.drain()  # mid-reply: its first audio is out
                    seen.append("audio")
                elif message.get("text") is not None:
                    seen.append(json.loads(message["text"])["type"])
                else:
                    code = message.get("code")
                    break
        except WebSocketDisconnect as closed:
            code = closed.code
        assert code == 1012
        assert "record" in seen and seen.index("record") > seen.index("audio")  # the reply ended before the close
        assert client.post("/v1/audio/speech", json={"input": "more"}).status_code == 503
    service.close()
