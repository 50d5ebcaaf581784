"""The embedded Gemma 3 270M through llama-cpp-python: a real reply, streamed; cancellation mid-reply."""
import asyncio

import pytest

from llm.embedded import EmbeddedLLM, build_prompt
from tests.llm.streams import cancel_after

pytestmark = pytest.mark.slow


def test_prompt_is_few_shot_and_ends_with_the_assistant_cue():
    prompt = build_prompt([{"role": "system", "content": "be nice"}, {"role": "user", "content": "Hi\nthere"}])
    assert prompt.endswith("\nUser: Hi there\n\nAssistant:") and "Paris" in prompt and "be nice" not in prompt


@pytest.fixture(scope="module")
def llm():
    return EmbeddedLLM(max_tokens=40)


def test_a_short_streamed_reply(llm):
    async def reply():
        return [p async for p in llm.stream([{"role": "user", "content": "What color is the sky on a clear day?"}])]

    pieces = asyncio.run(reply())
    text = "".join(p.text for p in pieces)
    assert len(pieces) >= 2 and text.strip() and "User:" not in text
    assert [p.t_ns for p in pieces] == sorted(p.t_ns for p in pieces)


def test_cancelling_mid_reply_stops_generation(llm):
    async def scenario():
        got = await cancel_after(llm.stream([{"role": "user", "content": "Tell me a long story about a dragon."}]), 2)
        follow_up = [p async for p in llm.stream([{"role": "user", "content": "Say hello."}])]
        return got, follow_up

    got, follow_up = asyncio.run(scenario())
    assert len(got) >= 2 and follow_up  # the model is free again after the cancelled reply
