"""One `/ws` conversation, transport-free: client messages in (`receive`), events out through the adapter's `send`
(JSON-able dicts) and audio through its `send_audio` (s16le PCM at the codec's rate). The aiohttp server
(`agent/serve/server.py`) is one adapter; any other (an ASGI ingress) is another, with no second copy of this.

Client -> server: {"type": "user", "text"}, {"type": "interrupt"}, {"type": "settings", "mode"},
{"type": "resume", "history": [{"role", "content"}, ...], "mode"?} (a client reconnecting after the server lost
it: the conversation goes on with the history the client kept), and microphone audio (bytes: s16le at 16 kHz).
Server -> client: "ready", "text" (the LLM's pieces), "word" (each spoken word and its time in the reply's
audio, before that audio), "heard" (the microphone's transcript), "record" (the turn's latency record),
"history" (the conversation as the LLM will read it next turn: keep it to `resume`), "error".

The server keeps nothing it cannot lose: the history that matters is the client's. Threads: the event loop.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace

import numpy as np

from agent.listen import HeardLine, Listener
from agent.orchestrator import Agent
from audio_io.capture import CAPTURE_RATE, QueueMicrophone
from audio_io.sinks import ClockSink
from tts.inference.streaming import MODES

MAX_RESUME_MESSAGES = 64  # a resumed history keeps at most this many messages (the agent reads its last turns)
ROLES = ("user", "assistant")


class ConversationSink(ClockSink):
    """A conversation's player: what it plays goes to the client as PCM on the player clock; words go ahead."""

    def __init__(self, sample_rate: int, send_audio: Callable[[np.ndarray], None], send_event: Callable[[dict], None]):
        super().__init__(sample_rate, pace=True)
        self.send_audio, self.send_event = send_audio, send_event

    def _record(self, samples: np.ndarray) -> None:
        self.send_audio(samples)

    def show_words(self, word_times) -> None:
        """Each word with its place in the reply's audio (seconds from its first sample), sent before that audio."""
        for word in word_times:
            self.send_event({"type": "word", **word.to_json()})


class Conversation:
    """`send(event)` and `send_audio(samples)` must not block (the adapter queues them); `on_turn(record)` lets
    the adapter observe each finished turn (metrics)."""

    def __init__(self, bundles, llm_factory, turn_config, worker, send: Callable[[dict], None],
                 send_audio: Callable[[np.ndarray], None], max_input_chars: int = 4096,
                 on_turn: Callable[[object], Awaitable[None] | None] | None = None):
        tts = {"s5": bundles["s5"], "t5": bundles.get("t5", bundles["s5"]), "sentence": bundles.get("t5", bundles["s5"])}
        self.rate = bundles["s5"].codec.sample_rate
        self.send, self.max_input_chars, self.on_turn = send, max_input_chars, on_turn
        self.llm = llm_factory()
        sink = ConversationSink(self.rate, send_audio, send)
        self.agent = Agent(self.llm, tts, sink, replace(turn_config, synthesis=replace(turn_config.synthesis, seed=0)),
                           worker=worker, on_piece=lambda text: send({"type": "text", "text": text}))
        self.turn: asyncio.Task | None = None
        self.microphone, self.hearing = QueueMicrophone(), None

    def ready(self, **extra) -> None:
        """The first event; `extra` adds what the adapter knows (a Ray replica's name)."""
        self.send({"type": "ready", "sample_rate": self.rate, "modes": list(MODES), "microphone_rate": CAPTURE_RATE,
                   **extra})

    async def receive(self, message: dict | bytes) -> None:
        """One client message (a parsed JSON object, or microphone bytes)."""
        if isinstance(message, (bytes, bytearray)):  # microphone: s16le at CAPTURE_RATE
            self.hearing = self.hearing or asyncio.create_task(self._hear())
            pcm = np.frombuffer(bytes(message[: len(message) // 2 * 2]), "<i2")
            self.microphone.feed(pcm.astype(np.float32) / 32768)
            return
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "settings":
            self._set_mode(message.get("mode"))
        elif kind == "resume":
            await self._resume(message)
        elif kind in ("user", "interrupt"):
            await self._stop_turn()
            text = str(message.get("text", ""))
            if kind == "user" and text.strip():
                if len(text) > self.max_input_chars:
                    self.error(f"text: at most {self.max_input_chars} characters")
                else:
                    self.turn = asyncio.create_task(self._run(text))
        elif kind is None:
            self.error('messages are JSON objects with a "type"')
        else:
            self.error(f"unknown message type {kind!r}")

    def error(self, message: str) -> None:
        self.send({"type": "error", "message": message})

    def _set_mode(self, mode) -> bool:
        if mode not in MODES:
            self.error(f"mode: one of {', '.join(MODES)}")
            return False
        self.agent.config.tts_mode = mode
        return True

    async def _resume(self, message: dict) -> None:
        history = message.get("history")
        if not isinstance(history, list) or not all(
                isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in history):
            self.error('resume: "history" is a list of {"role": "user"|"assistant", "content": text}')
            return
        if "mode" in message and not self._set_mode(message["mode"]):
            return
        await self._stop_turn()
        self.agent.history = [{"role": m["role"], "content": m["content"][: self.max_input_chars]}
                              for m in history[-MAX_RESUME_MESSAGES:]]
        self.send({"type": "history", "history": self.agent.history})

    async def _run(self, text: str, heard: HeardLine | None = None) -> None:
        record = await self.agent.run_turn(text, heard=heard)
        self.send({"type": "record", "record": record.to_json()})
        self.send({"type": "history", "history": self.agent.history})
        if self.on_turn is not None:
            result = self.on_turn(record)
            if asyncio.iscoroutine(result):
                await result

    async def _hear(self) -> None:
        """The client's microphone: Silero VAD + Whisper, half-duplex as in `s5 chat --voice`."""
        await Listener.warm_up()
        async for heard in Listener(self.microphone).lines():
            if self.turn is not None and not self.turn.done():
                continue  # the microphone hears the agent itself while it speaks
            self.send({"type": "heard", "text": heard.text})
            if heard.text:
                self.turn = asyncio.create_task(self._run(heard.text, heard))

    async def _stop_turn(self) -> None:
        if self.turn is not None and not self.turn.done():
            self.agent.interrupt()
            await asyncio.gather(self.turn, return_exceptions=True)

    @property
    def speaking(self) -> bool:
        return self.turn is not None and not self.turn.done()

    async def close(self) -> None:
        if self.hearing is not None:
            self.hearing.cancel()
        await self._stop_turn()
        await self.llm.close()
