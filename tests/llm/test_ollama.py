"""The Ollama backend through the official client over real HTTP, against a server speaking Ollama's protocol."""
import asyncio

import pytest

from llm.base import LLMError
from llm.ollama_backend import OllamaLLM
from tests.llm.streams import cancel_after
from tests.ollama_standin import REPLY, REQUESTS, free_port, start

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def run_against_server(model: str, body, server: bool = True):
    async def scenario():
        port = free_port()
        runner = await start(port) if server else None
        llm = OllamaLLM(model, f"http://127.0.0.1:{port}")
        try:
            return await body(llm), (runner.app[REQUESTS] if runner else [])
        finally:
            await llm.close()
            if runner:
                await runner.cleanup()

    return asyncio.run(scenario())


async def collect(llm, received=None):
    received = [] if received is None else received
    async for piece in llm.stream(MESSAGES):
        received.append(piece.text)
    return received


def test_normal_stream_with_timing_fields_and_warm_up():
    async def body(llm):
        assert await llm.available()
        await llm.warm_up()
        return await collect(llm), llm.stats

    (pieces, stats), requests = run_against_server("llama3.3:70b", body)
    assert pieces == REPLY
    assert stats.server["eval_count"] == len(REPLY) and stats.server["eval_duration"] == 700_000_000
    assert requests[0]["messages"] == [] and requests[0]["keep_alive"] == "30m"  # the warm-up load request
    assert requests[1]["stream"] is True and requests[1]["messages"] == MESSAGES


def test_slow_tokens_arrive_one_by_one():
    async def body(llm):
        stamps = []
        async for piece in llm.stream(MESSAGES):
            stamps.append(piece.t_ns)
        return stamps

    stamps, _ = run_against_server("slow", body)
    assert len(stamps) == len(REPLY) and stamps == sorted(stamps) and stamps[-1] > stamps[0]


def test_thinking_is_dropped():
    async def body(llm):
        return await collect(llm), llm.stats

    (pieces, stats), _ = run_against_server("thinker", body)
    assert "".join(pieces) == "".join(REPLY) and stats.dropped_thinking_chars > 0


@pytest.mark.parametrize(
    "model, message",
    [
        ("error-mid", "Ollama reported an error mid-reply: an error was encountered"),
        ("disconnect", "dropped mid-reply"),
        ("mistral:7b", "run `ollama pull mistral:7b`"),
    ],
)
def test_failures_become_one_line_and_keep_what_arrived(model, message):
    async def body(llm):
        received = []
        with pytest.raises(LLMError) as error:
            await collect(llm, received)
        return received, str(error.value)

    (received, text), _ = run_against_server(model, body)
    assert message in text and "\n" not in text
    if model in ("error-mid", "disconnect"):
        assert received == REPLY[:4]


def test_server_down_says_how_to_start_it():
    async def body(llm):
        assert not await llm.available()
        with pytest.raises(LLMError) as error:
            await collect(llm)
        return str(error.value)

    text, _ = run_against_server("llama3.3:70b", body, server=False)
    assert "cannot reach Ollama" in text and "ollama serve" in text


def test_cancelling_mid_stream_stops_the_request():
    async def body(llm):
        return [piece.text for piece in await cancel_after(llm.stream(MESSAGES), 2)]

    received, _ = run_against_server("slow", body)
    assert 2 <= len(received) < len(REPLY)
