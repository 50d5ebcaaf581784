"""Any OpenAI-compatible chat server (vLLM, TGI, llama.cpp's server, LM Studio, a hosted API) through the official
`openai` client: `chat.completions.create(..., stream=True)` over HTTP.

Failures become one `LLMError` line that says what to do, as for Ollama: server down, model unknown, a rejected key,
an error or a dropped connection mid-reply."""
from __future__ import annotations

import os
import time
from typing import AsyncIterator

from .base import LLMError, Piece, StreamStats, strip_thinking

DEFAULT_URL = "http://localhost:8000/v1"  # vLLM's and llama.cpp's usual port


class OpenAILLM:
    name = "openai"

    def __init__(self, model: str, base_url: str = DEFAULT_URL, api_key: str | None = None, timeout: float = 120.0,
                 max_tokens: int | None = None):
        try:
            from openai import AsyncOpenAI
        except ImportError as e:
            raise LLMError("the openai client is not installed: pip install openai (./setup.sh does)") from e
        if not model:
            raise LLMError("--llm openai needs --llm-model (the name the server knows the model by)")
        self.model = model
        self.base_url = base_url
        self.max_tokens = max_tokens
        # servers on one's own machine take no key; the client insists on one, so a placeholder stands in
        key = api_key or os.environ.get("OPENAI_API_KEY") or "none"
        self.client = AsyncOpenAI(base_url=base_url, api_key=key, timeout=timeout, max_retries=0)
        self.stats = StreamStats(backend="openai", model=model)

    async def available(self) -> bool:
        """Does the server answer and list this model? (GET /models; never raises)"""
        try:
            listing = await self.client.models.list()
        except Exception:
            return False
        return any(m.id == self.model for m in listing.data)

    async def warm_up(self) -> None:
        """One token, so the first turn finds the model loaded (and a wrong URL or model fails here, in one line)."""
        try:
            await self.client.chat.completions.create(model=self.model, max_tokens=1,
                                                      messages=[{"role": "user", "content": "Hi"}])
        except Exception as e:
            raise self._explain(e) from e

    async def stream(self, messages: list[dict]) -> AsyncIterator[Piece]:
        self.stats = StreamStats(backend="openai", model=self.model)
        think_state: dict = {}
        finished = False
        try:
            extra = {"max_tokens": self.max_tokens} if self.max_tokens else {}
            chunks = await self.client.chat.completions.create(model=self.model, messages=messages, stream=True,
                                                               **extra)
            async for chunk in chunks:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                text, dropped = strip_thinking(choice.delta.content or "", think_state)
                self.stats.dropped_thinking_chars += dropped
                if text:
                    self.stats.pieces += 1
                    yield Piece(text, time.perf_counter_ns())
                if choice.finish_reason is not None:
                    self.stats.server = {"finish_reason": choice.finish_reason}
                    finished = True
        except LLMError:
            raise
        except Exception as e:
            raise self._explain(e, mid_stream=self.stats.pieces > 0) from e
        if not finished:
            raise LLMError(f"the server at {self.base_url} ended the stream before the reply was done; try again")

    def _explain(self, error: Exception, mid_stream: bool = False) -> LLMError:
        import openai

        if isinstance(error, openai.NotFoundError):
            return LLMError(f"the server at {self.base_url} has no model {self.model!r} (or no chat completions "
                            "there): check --llm-model and --llm-url (it usually ends in /v1)")
        if isinstance(error, openai.AuthenticationError):
            return LLMError(f"the server at {self.base_url} refused the key: set OPENAI_API_KEY")
        if isinstance(error, openai.APIStatusError):
            where = "mid-reply" if mid_stream else "on the request"
            detail = str(error.message or "").splitlines()[0] if error.message else f"status {error.status_code}"
            return LLMError(f"the server at {self.base_url} reported an error {where}: {detail}")
        if isinstance(error, openai.APIConnectionError):
            if mid_stream:
                return LLMError(f"the connection to {self.base_url} dropped mid-reply; try again")
            return LLMError(f"cannot reach an OpenAI-compatible server at {self.base_url}: start it (or use --llm embedded)")
        return LLMError(f"the OpenAI-compatible server failed: {type(error).__name__}: "
                        f"{str(error).splitlines()[0] if str(error) else ''}")

    async def close(self) -> None:
        await self.client.close()
