"""One conversation: each turn runs three async stages joined by a queue and the synthesizer's word input.

    llm stage    llm.stream(messages) -> pieces queue                     (stamps first/last token)
    words stage  pieces -> WordSegmenter -> TextNormalizer -> Speech.feed  (first word, word k+1)
    audio stage  Speech.play: synth.chunks() -> sink.write                (first chunk, last audio)

The words and audio stages are the pipeline driver every command runs (`tts.inference.pipeline.Speech`).

The sink stamps the first audible sample as played. `interrupt()` (new input, Ctrl-C) cancels every stage,
flushes queued audio and releases the synthesizer; the turn still returns its record. A spoken turn may start on
the VAD's guess that the user has finished (`held=True`): it runs silently until `confirm()`, or `retract()` drops
it. An LLM that fails mid-reply ends its stage with a one-line error: the words already received are still spoken.
A bug in any stage ends only its turn: one line in the record and on screen, the traceback in the log
(`agent/logs.py`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from llm.base import LLMBackend, LLMError
from tts.inference.pipeline import Sink, Speech
from tts.inference.streaming import DEFAULT_MAX_STRETCH, StreamingSynthesizer
from tts.inference.synthesis import SynthesisConfig, TTSBundle

from .config import HISTORY_TURNS, SYSTEM_PROMPT, AgentSettings
from .listen import HeardLine
from .logs import LOGGER, where_logged
from .records import TurnRecord, append_jsonl
from .segmenter import SpokenWords

END = object()
log = logging.getLogger(f"{LOGGER}.agent")


@dataclass
class AgentConfig:
    tts_mode: str = "s5"
    system_prompt: str = SYSTEM_PROMPT
    history_turns: int = HISTORY_TURNS
    emit_every: int | None = None  # t5 / sentence: decoder steps per chunk (None: the paper's 0.35 s)
    synthesis: SynthesisConfig = field(default_factory=SynthesisConfig)
    max_stretch: float = DEFAULT_MAX_STRETCH  # s5 pacing when the LLM writes slower than the voice speaks (1: off)
    records_path: Path | None = None  # JSONL, one line per turn

    @classmethod
    def from_settings(cls, settings: AgentSettings, mode: str, records_path: Path | None = None) -> AgentConfig:
        """The turn settings of a loaded agent config (`configs/agent.yaml`), in one TTS mode."""
        return cls(tts_mode=mode, system_prompt=settings.system_prompt, history_turns=settings.history_turns,
                   emit_every=settings.tts.emit_every, synthesis=settings.tts.synthesis(),
                   max_stretch=settings.tts.max_stretch, records_path=records_path)


INTERRUPTED_MARK = "[interrupted by the user]"  # ends an assistant turn cut short, in the history the LLM reads


class SpokenText:
    """The written words of a reply, and for each spoken word the written word it came from ("$738.67" is seven
    spoken words): what the user heard, written as the LLM wrote it."""

    def __init__(self):
        self.written: list[str] = []
        self.source: list[int] = []  # spoken word -> index in `written`

    def wrote(self, word: str) -> None:
        self.written.append(word)

    def spoke(self) -> None:
        """A spoken word of the last written word."""
        self.source.append(len(self.written) - 1)

    def heard_text(self, spoken_heard: int) -> str:
        """The written words whose first spoken word had begun to sound, as written."""
        if spoken_heard <= 0 or not self.source:
            return ""
        return " ".join(self.written[: self.source[min(spoken_heard, len(self.source)) - 1] + 1])


class Agent:
    def __init__(self, llm: LLMBackend, bundles: dict[str, TTSBundle], sink: Sink,
                 config: AgentConfig | None = None, on_piece: Callable[[str], None] | None = None, worker=None):
        self.llm = llm
        self.worker = worker  # a server's `StreamWorker`: the turns' synthesis runs there among other sessions
        self.bundles = bundles  # tts mode -> bundle
        self.sink = sink
        self.config = config or AgentConfig()
        self.on_piece = on_piece
        self.history: list[dict] = []
        self.turns = 0
        self.turn_record: TurnRecord | None = None
        self._interrupted = asyncio.Event()
        self._interrupt_ns: int | None = None
        self._retracted = False

    def messages_for(self, user: str) -> list[dict]:
        kept = self.history[-2 * self.config.history_turns :] if self.config.history_turns else []
        return [{"role": "system", "content": self.config.system_prompt}, *kept, {"role": "user", "content": user}]

    def interrupt(self) -> None:
        """Barge-in: stop the running turn now (safe to call when none runs)."""
        self._interrupt_ns = time.perf_counter_ns()
        self._interrupted.set()

    def confirm(self) -> None:
        """A turn started on a guess (`run_turn(held=True)`): the user has finished, so its audio may play."""
        self.sink.release()

    def retract(self) -> None:
        """A turn started on a guess: the user went on speaking, so it goes unheard and stays out of the history."""
        self._retracted = True
        self.interrupt()

    async def run_turn(self, user: str, tts_mode: str | None = None, heard: HeardLine | None = None,
                       held: bool = False) -> TurnRecord:
        """heard: the user spoke this turn (its speech and transcript stamps go into the record). held: the turn
        starts on a guess: it runs, but the sink plays nothing until `confirm()` (or `retract()` drops it)."""
        mode = tts_mode or self.config.tts_mode
        self.turns += 1
        self._interrupted.clear()
        self._interrupt_ns = None
        self._retracted = False
        record = TurnRecord(self.turns, mode, getattr(self.llm, "name", "llm"), user)
        self.turn_record = record  # the turn running, or the last one: its stages fill it as they go
        record.started_on_guess = held
        if heard is not None:
            record.user_speech_start, record.user_speech_end = heard.speech_start_ns, heard.speech_end_ns
            record.transcript_ready = heard.transcript_ready_ns
        synth = StreamingSynthesizer(self.bundles[mode], mode, self.config.synthesis, self.config.emit_every,
                                     max_stretch=self.config.max_stretch, worker=self.worker)
        speech = Speech(synth, self.sink)
        pieces: asyncio.Queue = asyncio.Queue()
        reply: list[str] = []
        said = SpokenText()  # which written word each spoken word came from
        self.sink.begin_turn(held=held)
        record.synthesis, record.playback = synth.times, self.sink.stats  # each stage writes its own record
        record.request_sent = time.perf_counter_ns()
        stages = [
            asyncio.create_task(self._llm_stage(self.messages_for(user), pieces, reply, record, synth.note_token)),
            asyncio.create_task(speech.feed(self._spoken_words(pieces, said))),
            asyncio.create_task(speech.play()),
        ]
        interrupted = asyncio.create_task(self._interrupted.wait())
        try:
            pending = set(stages)
            while pending and not interrupted.done():
                done, pending = await asyncio.wait(pending | {interrupted}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(interrupted)
                for task in done - {interrupted}:
                    task.result()  # a stage's own bug surfaces here
            if interrupted.done():
                await self._stop(stages, record)
            else:
                self.sink.end_turn()
                await self._drain_or_interrupt(interrupted, record)
        except Exception as error:  # a bug in one stage ends its turn, not the conversation
            log.exception("turn %d (%s, user %r) failed", record.turn, mode, user)
            first_line = str(error).splitlines()[0] if str(error) else ""
            record.error = f"this turn failed: {type(error).__name__}: {first_line} ({where_logged()})"
            await self._stop(stages, record, cancelled=False)
        finally:
            interrupted.cancel()
            for task in stages:
                task.cancel()
            await synth.aclose()
            self._finish_record(record, "".join(reply), said)
        return record

    async def _stop(self, stages: list[asyncio.Task], record: TurnRecord, cancelled: bool = True) -> None:
        for task in stages:
            task.cancel()
        self._flush(record)
        self.sink.end_turn()
        record.cancelled = cancelled
        if cancelled:
            self._stamp_silence(record)
        await asyncio.gather(*stages, return_exceptions=True)

    async def _drain_or_interrupt(self, interrupted: asyncio.Task, record: TurnRecord) -> None:
        drain = asyncio.create_task(self.sink.drain())
        await asyncio.wait({drain, interrupted}, return_when=asyncio.FIRST_COMPLETED)
        if not drain.done():
            drain.cancel()
            self._flush(record)
            record.cancelled = True
            self._stamp_silence(record)

    def _flush(self, record: TurnRecord) -> None:
        """Drop what has not played; what had played decides the words the user heard."""
        self.sink.flush()
        record.words_heard = record.synthesis.words_heard(self.sink.stats.played_samples / self.sink.sample_rate)

    def _stamp_silence(self, record: TurnRecord) -> None:
        """The queued audio is dropped now; what the device already holds still plays for its output latency."""
        record.interrupted_at = self._interrupt_ns
        record.silenced = time.perf_counter_ns() + self.sink.output_latency_ns

    # ---- stages ---------------------------------------------------------------------------------------------
    async def _llm_stage(self, messages: list[dict], pieces: asyncio.Queue, reply: list[str], record: TurnRecord,
                         on_token: Callable[[int], None] | None = None) -> None:
        try:
            async for piece in self.llm.stream(messages):
                if record.first_token is None:
                    record.first_token = piece.t_ns
                record.last_token = piece.t_ns
                if on_token is not None:
                    on_token(piece.t_ns)  # the synthesizer paces slow LLMs by their token rate
                reply.append(piece.text)
                if self.on_piece:
                    self.on_piece(piece.text)
                pieces.put_nowait(piece)
        except LLMError as e:
            record.error = str(e)
        except Exception as e:  # an unexpected backend failure still ends the turn with one line
            record.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'LLM failed'}"
        finally:
            pieces.put_nowait(END)
        record.llm_stats = dict(vars(self.llm.stats)) if getattr(self.llm, "stats", None) else {}

    @staticmethod
    async def _spoken_words(pieces: asyncio.Queue, said: "SpokenText | None" = None):
        """LLM pieces -> the words as spoken (`SpokenWords`), until the reply ends."""
        words = SpokenWords(said)
        while True:
            piece = await pieces.get()
            for word in words.flush(time.perf_counter_ns()) if piece is END else words.push(piece.text, piece.t_ns):
                yield word
            if piece is END:
                return

    # ---- bookkeeping ------------------------------------------------------------------------------------------
    def _finish_record(self, record: TurnRecord, reply: str, said: SpokenText) -> None:
        record.reply = reply
        record.retracted = self._retracted
        record.words_written = record.synthesis.spoken_words
        if not record.cancelled:
            record.words_heard = record.words_written
        elif reply.strip():  # the history keeps what the user heard, marked, not what the LLM wrote
            reply = f"{said.heard_text(record.words_heard)} {INTERRUPTED_MARK}".strip()
        if reply.strip() and not record.retracted:
            self.history += [{"role": "user", "content": record.user}, {"role": "assistant", "content": reply}]
            self.history = self.history[-2 * self.config.history_turns :] if self.config.history_turns else []
        if self.config.records_path is not None:
            append_jsonl(self.config.records_path, record)
