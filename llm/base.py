"""What every LLM backend offers: an async stream of text pieces, each stamped when it arrived."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

from audio_io.errors import UserError


@dataclass
class Piece:
    text: str
    t_ns: int  # time.perf_counter_ns() when the piece arrived


@dataclass
class StreamStats:
    """Filled in by a backend as a reply streams; the turn record logs it."""
    backend: str = ""
    model: str = ""
    pieces: int = 0
    dropped_thinking_chars: int = 0
    server: dict = field(default_factory=dict)  # e.g. Ollama's eval_count / eval_duration (ns)


class LLMError(UserError):
    """A one-line message that says what happened and what to do; the turn ends cleanly."""


class LLMBackend(Protocol):
    name: str
    stats: StreamStats

    async def warm_up(self) -> None: ...

    def stream(self, messages: list[dict]) -> AsyncIterator[Piece]:
        """Yield the reply to `messages` (role/content dicts) piece by piece; cancel the iteration (or its task)
        to stop mid-reply."""
        ...

    async def close(self) -> None: ...


def strip_thinking(text: str, state: dict) -> tuple[str, int]:
    """Remove <think>...</think> spans from streamed text; `state` carries an open span across pieces.
    Returns (kept text, characters dropped)."""
    kept, dropped = [], 0
    buffer = state.get("pending", "") + text
    state["pending"] = ""
    while buffer:
        if state.get("inside"):
            end = buffer.find("</think>")
            if end < 0:
                tail = _partial_suffix(buffer, "</think>")
                dropped += len(buffer) - tail
                state["pending"] = buffer[len(buffer) - tail :] if tail else ""
                break
            dropped += end + len("</think>")
            buffer = buffer[end + len("</think>") :]
            state["inside"] = False
        else:
            start = buffer.find("<think>")
            if start < 0:
                tail = _partial_suffix(buffer, "<think>")
                kept.append(buffer[: len(buffer) - tail])
                state["pending"] = buffer[len(buffer) - tail :] if tail else ""
                break
            kept.append(buffer[:start])
            buffer = buffer[start + len("<think>") :]
            state["inside"] = True
    return "".join(kept), dropped


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag (a tag split across pieces)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
