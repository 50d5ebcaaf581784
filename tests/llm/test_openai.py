"""The OpenAI-compatible backend against a real OpenAI-compatible server: llama-cpp-python's own, serving the
embedded Gemma on a loopback port (`tests/llama_server.py`), through the official `openai` client over HTTP."""
from __future__ import annotations

import asyncio
import os
import signal

import pytest

from llm.base import LLMError
from llm.openai_backend import OpenAILLM
from tests.llama_server import start_server
from tests.ollama_standin import free_port

pytest.importorskip("llama_cpp.server")  # the test extra installs it


@pytest.fixture(scope="module")
def openai_server():
    server, url = start_server()
    yield url
    server.terminate()
    server.wait(10)


async def collect(llm: OpenAILLM, messages: list[dict]) -> str:
    return "".join([piece.text async for piece in llm.stream(messages)])


def test_a_reply_streams_in_pieces_and_the_model_is_listed(openai_server):
    async def scenario():
        llm = OpenAILLM("gemma", openai_server, max_tokens=24)
        try:
            assert await llm.available()
            await llm.warm_up()
            text = await collect(llm, [{"role": "system", "content": "Answer briefly."},
                                       {"role": "user", "content": "What is the capital of France?"}])
            return text, llm.stats
        finally:
            await llm.close()

    text, stats = asyncio.run(scenario())
    assert text.strip() and stats.pieces > 1 and stats.backend == "openai"
    assert stats.server["finish_reason"] in ("stop", "length")


def test_a_server_that_is_down_is_one_line():
    async def scenario():
        llm = OpenAILLM("gemma", f"http://127.0.0.1:{free_port()}/v1")
        try:
            await llm.warm_up()
        finally:
            await llm.close()

    with pytest.raises(LLMError, match="cannot reach an OpenAI-compatible server"):
        asyncio.run(scenario())
    with pytest.raises(LLMError, match="--llm-model"):
        OpenAILLM("", "http://127.0.0.1:1/v1")


def test_a_server_that_dies_mid_reply_is_one_line_and_keeps_what_arrived():
    server, url = start_server(n_ctx=2048)

    async def scenario():
        llm = OpenAILLM("gemma", url, max_tokens=1500)
        received = []
        try:
            async for piece in llm.stream([{"role": "user", "content": "Tell me a very long story about a dragon."}]):
                received.append(piece.text)
                if len(received) == 5:
                    os.kill(server.pid, signal.SIGKILL)
        except LLMError as error:
            return received, str(error)
        finally:
            await llm.close()
        return received, None

    try:
        received, error = asyncio.run(scenario())
    finally:
        server.kill()
        server.wait(10)
    assert len(received) >= 5 and error is not None and "\n" not in error
    assert "mid-reply" in error or "before the reply was done" in error
