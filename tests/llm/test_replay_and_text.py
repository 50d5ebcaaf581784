"""Replay scripts, LLM-like tokenisation, and <think> stripping across pieces."""
import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm.base import LLMError, strip_thinking
from llm.replay import ReplayLLM, ReplayScript, tokenize_like_llm


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_llm_like_pieces_join_back_to_the_text(text):
    assert "".join(tokenize_like_llm(text)) == text


def test_pieces_start_words_and_split_long_ones():
    pieces = tokenize_like_llm("Hello, extraordinarily nice world.")
    assert pieces[:2] == ["Hello", ","] and pieces[-1] == "."
    assert " extrao" in pieces and "rdinar" in pieces  # sub-word pieces of a long word


def test_replay_plays_turns_in_order_with_recorded_delays():
    script = ReplayScript.from_dict({"name": "t", "llm": {"first_token_ms": 10, "tokens_per_second": 100}, "turns": [
        {"user": "a", "assistant": "One two."},
        {"user": "b", "assistant": "Three", "tokens": ["Thr", "ee"], "token_delays_ms": [30, 5]},
    ]})
    assert [round(t, 3) for _, t in script.schedule(script.turns[0])] == [0.01, 0.02, 0.03]

    async def both():
        llm = ReplayLLM(script)
        return [[p.text async for p in llm.stream([])] for _ in range(2)]

    assert asyncio.run(both()) == [["One", " two", "."], ["Thr", "ee"]]


@pytest.mark.parametrize(
    "data, message",
    [
        ({"turns": []}, "non-empty `turns:`"),
        ({"turns": [{"user": "x"}]}, "needs `user` and `assistant`"),
        ({"turns": [{"user": "x", "assistant": "ab", "tokens": ["a"]}]}, "do not join"),
        ({"turns": [{"user": "x", "assistant": "a b", "token_delays_ms": [1]}]}, "one delay per token"),
    ],
)
def test_bad_scripts_are_refused_with_one_line(data, message):
    with pytest.raises(LLMError, match=message):
        ReplayScript.from_dict(data)


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=6))
def test_think_spans_are_removed_however_the_text_is_cut(cuts):
    text = "Hi <think>secret plan</think>there<think>more</think>!"
    state, kept = {}, []
    points = sorted(set(c for c in cuts if c < len(text)))
    for a, b in zip([0] + points, points + [len(text)]):
        kept.append(strip_thinking(text[a:b], state)[0])
    assert "".join(kept) == "Hi there!"
