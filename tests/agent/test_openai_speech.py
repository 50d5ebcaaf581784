"""`s5 serve` as a drop-in for OpenAI's speech endpoint, called by the official `openai` client the way apps call
it (model "tts-1", voice "alloy", the default mp3), over real TCP against a running server with the shipped voice:
every format decodes back to speech Whisper understands, and the SSE stream carries OpenAI's events."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from agent.serve.audio_formats import decode
from tests.ollama_standin import free_port

TEXT = "The garden gate is painted green."


@pytest.fixture(scope="module")
def server():
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "agent.cli", "serve", "--port", str(port), "--llm", "none"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "CI": "true"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as response:
                    if json.load(response)["status"] == "ok":
                        break
            except OSError:
                if process.poll() is not None:
                    raise AssertionError(process.stderr.read().decode()[-800:])
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def heard(audio, rate) -> set[str]:
    from audio_io.asr import transcribe

    return set(transcribe(audio, rate).lower().replace(".", " ").replace(",", " ").split())


@pytest.mark.slow
@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_the_official_client_gets_speech_in_every_format(server, response_format):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="not-needed")
    kwargs = {} if response_format == "mp3" else {"response_format": response_format}  # mp3: the client's default
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input=TEXT, **kwargs) as reply:
        pieces = [piece for piece in reply.iter_bytes(4096)]
        rate = int(reply.headers["X-Sample-Rate"])
    data = b"".join(pieces)
    if response_format == "pcm":
        import numpy as np

        audio = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768
    else:
        audio, rate = decode(data)
    assert 1.0 < len(audio) / rate < 5.0  # six words, spoken
    assert {"garden", "green"} <= heard(audio, rate)


@pytest.mark.slow
def test_server_sent_events_as_openai_documents_them(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="not-needed")
    with client.audio.speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="nova", input=TEXT,
                                                            response_format="mp3", stream_format="sse") as reply:
        lines = [line for line in reply.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1) and len(events) > 2
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["input_tokens"] > 0
    audio, rate = decode(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]))
    assert {"garden", "green"} <= heard(audio, rate)


@pytest.mark.slow
def test_a_bad_request_is_one_line_from_the_client(server):
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="not-needed")
    with pytest.raises(BadRequestError, match="unknown voice 'robot'"):
        client.audio.speech.create(model="tts-1", voice="robot", input=TEXT)
    assert client.audio.speech.create(model="tts-1", voice="alloy", input="Still here.").content  # still serving


@pytest.mark.slow
def test_bench_serve_measures_a_running_server(server):
    """`s5 bench serve --url`: the same figures from a server this process did not start."""
    import asyncio

    from agent.bench.serve import bench_serve

    result = asyncio.run(bench_serve(None, ["Hello there.", "How are you today?"], [1, 2], url=server))
    assert [r["sessions"] for r in result["runs"]] == [1, 2] and result["url"] == server
    for run in result["runs"]:
        assert run["errors"] == 0 and 0 < run["first_audible_ms_p50"] <= run["first_audible_ms_p95"]
        assert run["cpu_s_per_audio_s"] is None and run["render_ms_per_audio_s"] is None  # not this process's
        assert run["decode_ms_per_audio_s"] is None and run["opening_ms"] is None
