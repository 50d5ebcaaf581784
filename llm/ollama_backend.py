"""Ollama through its official client: `AsyncClient.chat(..., stream=True)` over HTTP.

Failures become one `LLMError` line that says what to do: server down (start it), model not pulled (the
`ollama pull` line), an error object in the stream, or the connection dropping mid-reply."""
from __future__ import annotations

import time
from typing import AsyncIterator

import httpx

from .base import LLMError, Piece, StreamStats, strip_thinking

DEFAULT_HOST = "http://localhost:11434"
DEFAULT_MODEL = "llama3.3:70b"  # the paper's setup (Q4_K_M)
TIMING_FIELDS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration")


class OllamaLLM:
    name = "ollama"

    def __init__(self, model: str = DEFAULT_MODEL, host: str = DEFAULT_HOST, keep_alive: str | float = "30m",
                 options: dict | None = None, timeout: float = 120.0):
        try:
            from ollama import AsyncClient
        except ImportError as e:
            raise LLMError("the ollama client is not installed: pip install ollama (./setup.sh does)") from e

        self.model = model
        self.host = host
        self.keep_alive = keep_alive
        self.options = options or {}
        self.client = AsyncClient(host=host, timeout=timeout)
        self.stats = StreamStats(backend="ollama", model=model)

    async def available(self) -> bool:
        """Is the server up with this model pulled? (GET /api/tags; never raises)"""
        try:
            listing = await self.client.list()
        except Exception:
            return False
        return any(self._same_model(m.model) for m in listing.models)

    def _same_model(self, name: str | None) -> bool:
        if not name:
            return False
        want = self.model if ":" in self.model else f"{self.model}:latest"
        return name == want or name == self.model

    async def warm_up(self) -> None:
        """Load the model into memory (a chat with no messages) and keep it there for keep_alive."""
        try:
            await self.client.chat(model=self.model, messages=[], keep_alive=self.keep_alive)
        except Exception as e:
            raise self._explain(e) from e

    async def stream(self, messages: list[dict]) -> AsyncIterator[Piece]:
        self.stats = StreamStats(backend="ollama", model=self.model)
        think_state: dict = {}
        try:
            parts = await self.client.chat(model=self.model, messages=messages, stream=True, keep_alive=self.keep_alive,
                                           options=self.options or None)
            async for part in parts:
                message = part.message
                if message.thinking:
                    self.stats.dropped_thinking_chars += len(message.thinking)
                text, dropped = strip_thinking(message.content or "", think_state)
                self.stats.dropped_thinking_chars += dropped
                if text:
                    self.stats.pieces += 1
                    yield Piece(text, time.perf_counter_ns())
                if part.done:
                    self.stats.server = {f: getattr(part, f) for f in TIMING_FIELDS if getattr(part, f, None) is not None}
                    return
        except LLMError:
            raise
        except Exception as e:
            raise self._explain(e, mid_stream=self.stats.pieces > 0) from e
        raise LLMError(f"Ollama ended the stream before the reply was done (model {self.model}); try again")

    def _explain(self, error: Exception, mid_stream: bool = False) -> LLMError:
        from ollama import ResponseError

        if isinstance(error, ResponseError):
            text = str(error.error).strip().splitlines()[0] if error.error else f"status {error.status_code}"
            if error.status_code == 404 or "not found" in text.lower():
                return LLMError(f"Ollama has no model {self.model!r}: run `ollama pull {self.model}` (or pick one with --ollama-model)")
            where = "mid-reply" if mid_stream else "on the request"
            return LLMError(f"Ollama reported an error {where}: {text}")
        if isinstance(error, (ConnectionError, httpx.ConnectError, httpx.ConnectTimeout)) and not mid_stream:
            return LLMError(f"cannot reach Ollama at {self.host}: start it with `ollama serve` (or use --llm embedded)")
        if isinstance(error, (httpx.HTTPError, ConnectionError)):
            return LLMError(f"the connection to Ollama at {self.host} dropped mid-reply ({type(error).__name__}); try again")
        return LLMError(f"Ollama failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")

    async def close(self) -> None:
        client = getattr(self.client, "_client", None)
        if client is not None:
            await client.aclose()
