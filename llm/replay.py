"""Scripted LLM streams from YAML, for benchmarks and unattended replays.

    name: short answers
    llm: {first_token_ms: 350, tokens_per_second: 25}   # optional; these are the defaults
    turns:
      - user: What is the capital of France?
        assistant: The capital of France is Paris.
        tokens: [" The", " capital", ...]          # optional explicit pieces (must join to `assistant`)
        token_delays_ms: [350, 40, 38, ...]        # optional recorded delay before each piece
        interrupt_after_s: 1.2                     # optional: the user barges in 1.2 s after the first sound

Without explicit tokens the assistant text is split into word-start pieces as an LLM tokenizer would
(" capital", ",", " Paris", "."), long words into several sub-word pieces.
"""
from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

import yaml

from .base import LLMError, Piece, StreamStats

# Llama 3.3 70B INT4 on Ollama, as the paper's setup streams it: first token after ~0.35 s, ~25 tokens/s
DEFAULT_FIRST_TOKEN_MS = 350.0
DEFAULT_TOKENS_PER_SECOND = 25.0
SUBWORD_CHARS = 6
PIECE_PATTERN = re.compile(r"\s*[A-Za-z0-9']+|\s*[^\sA-Za-z0-9']|\s+")


def tokenize_like_llm(text: str) -> list[str]:
    """Word-start pieces: leading whitespace stays with the next word, punctuation is its own piece, and words
    longer than 8 characters come in sub-word pieces. "".join(pieces) == text."""
    pieces = []
    for match in PIECE_PATTERN.findall(text):
        word = match.lstrip()
        if len(word) > 8 and word.isalnum():
            lead = match[: len(match) - len(word)]
            parts = [word[i : i + SUBWORD_CHARS] for i in range(0, len(word), SUBWORD_CHARS)]
            pieces.append(lead + parts[0])
            pieces.extend(parts[1:])
        else:
            pieces.append(match)
    return pieces


@dataclass
class ReplayTurn:
    user: str
    assistant: str
    tokens: list[str] = field(default_factory=list)
    token_delays_ms: list[float] = field(default_factory=list)
    interrupt_after_s: float | None = None  # the user barges in this long after the reply's first sound


@dataclass
class ReplayScript:
    name: str
    turns: list[ReplayTurn]
    first_token_ms: float = DEFAULT_FIRST_TOKEN_MS
    tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND

    @classmethod
    def load(cls, path: Path | str) -> "ReplayScript":
        path = Path(path)
        if not path.exists():
            raise LLMError(f"no replay script at {path}")
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as e:
            raise LLMError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from e
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data, where: str = "script") -> "ReplayScript":
        if not isinstance(data, dict) or not isinstance(data.get("turns"), list) or not data["turns"]:
            raise LLMError(f"{where}: expected a mapping with a non-empty `turns:` list")
        llm = data.get("llm") or {}
        turns = []
        for i, raw in enumerate(data["turns"], start=1):
            if not isinstance(raw, dict) or "user" not in raw or "assistant" not in raw:
                raise LLMError(f"{where}: turn {i} needs `user` and `assistant`")
            interrupt = raw.get("interrupt_after_s")
            if interrupt is not None and (not isinstance(interrupt, (int, float)) or interrupt < 0):
                raise LLMError(f"{where}: turn {i}: `interrupt_after_s` is seconds after the first sound (>= 0)")
            turn = ReplayTurn(str(raw["user"]), str(raw["assistant"]), [str(t) for t in raw.get("tokens") or []],
                              [float(d) for d in raw.get("token_delays_ms") or []],
                              None if interrupt is None else float(interrupt))
            if turn.tokens and "".join(turn.tokens) != turn.assistant:
                raise LLMError(f"{where}: turn {i}: `tokens` do not join to the assistant text")
            if turn.token_delays_ms and len(turn.token_delays_ms) != len(turn.tokens or tokenize_like_llm(turn.assistant)):
                raise LLMError(f"{where}: turn {i}: one delay per token is needed")
            turns.append(turn)
        return cls(str(data.get("name", where)), turns, float(llm.get("first_token_ms", DEFAULT_FIRST_TOKEN_MS)),
                   float(llm.get("tokens_per_second", DEFAULT_TOKENS_PER_SECOND)))

    def schedule(self, turn: ReplayTurn) -> list[tuple[str, float]]:
        """(piece, seconds after the request) for every piece of a turn."""
        pieces = turn.tokens or tokenize_like_llm(turn.assistant)
        if turn.token_delays_ms:
            delays = [d / 1000 for d in turn.token_delays_ms]
        else:
            delays = [self.first_token_ms / 1000] + [1 / self.tokens_per_second] * (len(pieces) - 1)
        times, t = [], 0.0
        for delay in delays:
            t += delay
            times.append(t)
        return list(zip(pieces, times))


class ReplayLLM:
    """Plays a script's assistant turns in order, one per `stream()` call, on the script's clock."""

    name = "replay"

    def __init__(self, script: ReplayScript):
        self.script = script
        self.next_turn = 0
        self.stats = StreamStats(backend="replay", model=script.name)

    async def warm_up(self) -> None:
        pass

    async def stream(self, messages: list[dict]) -> AsyncIterator[Piece]:
        if self.next_turn >= len(self.script.turns):
            raise LLMError(f"replay script {self.script.name!r} has no turn {self.next_turn + 1}")
        turn = self.script.turns[self.next_turn]
        self.next_turn += 1
        self.stats = StreamStats(backend="replay", model=self.script.name)
        start = time.perf_counter()
        for piece, at in self.script.schedule(turn):
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            self.stats.pieces += 1
            yield Piece(piece, time.perf_counter_ns())

    async def close(self) -> None:
        pass
