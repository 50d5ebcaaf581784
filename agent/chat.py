"""`s5 chat`: the voices and the LLM it runs, the chat loop, and turn-taking for spoken input."""
from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from rich.console import Console

from agent.listen import HeardLine, Listener, SpeechResumed, UserSpeaking
from agent.orchestrator import Agent, AgentConfig
from audio_io.sinks import WavSink
from llm.base import LLMBackend, LLMError
from tts.cli import notice
from tts.inference.streaming import WORKER_TORCH_THREADS, load_bundle
from tts.inference.synthesis import TTSBundle

if TYPE_CHECKING:
    from agent.config import LLMSettings
    from agent.records import TurnRecord


def load_bundles(modes: list[str], s5_model: Path | None = None, t5_model: Path | None = None,
                 vocoder: str | None = None, render_threads: int = WORKER_TORCH_THREADS) -> dict[str, TTSBundle]:
    """The voices the modes run (s5, or the full-context model for t5 and sentence), each loaded once; `vocoder`
    replaces the codec's own ("auto"); warmed for renders on `render_threads` torch threads."""
    bundles: dict[str, TTSBundle] = {}
    cache: dict[str, TTSBundle] = {}
    for mode in modes:
        key = "s5" if mode == "s5" else "t5"
        if key not in cache:
            cache[key] = load_bundle(mode, s5_model if key == "s5" else t5_model, vocoder=vocoder,
                                     render_threads=render_threads)
            warn_of_a_named_vocoder(cache[key])
        bundles[mode] = cache[key]
    return bundles


def warn_of_a_named_vocoder(bundle: TTSBundle) -> None:
    """A vocoder the user named that this machine's timings say cannot play without gaps: one line, said once."""
    warning = getattr(bundle.codec, "named_warning", None)
    if warning:
        notice(warning)
        bundle.codec.named_warning = None


@dataclass
class LLMChoice:
    """Which LLM, and where (resolved by `agent/settings.py`: flag, environment, file, default)."""
    kind: str  # auto, ollama, openai or embedded
    ollama_model: str
    ollama_host: str
    keep_alive: str = "30m"
    openai_url: str | None = None
    openai_model: str | None = None
    max_tokens: int | None = None
    openai_api_key: str | None = None

    @classmethod
    def from_settings(cls, settings: "LLMSettings") -> "LLMChoice":
        return cls(settings.backend, settings.ollama_model, settings.ollama_host, keep_alive=settings.keep_alive,
                   openai_url=settings.openai_url, openai_model=settings.openai_model,
                   max_tokens=settings.max_tokens, openai_api_key=settings.openai_api_key)

    def new(self, kind: str | None = None) -> LLMBackend:
        """A backend of `kind` (default: the chosen one; not auto), not yet contacted: `s5 serve` makes one per
        conversation."""
        kind = kind or self.kind
        if kind == "openai":
            from llm.openai_backend import DEFAULT_URL, OpenAILLM

            return OpenAILLM(self.openai_model or "", self.openai_url or DEFAULT_URL, api_key=self.openai_api_key,
                             max_tokens=self.max_tokens)
        if kind == "ollama":
            from llm.ollama_backend import OllamaLLM

            return OllamaLLM(self.ollama_model, self.ollama_host, keep_alive=self.keep_alive)
        if kind == "embedded":
            from llm.embedded import EmbeddedLLM

            return EmbeddedLLM()
        raise LLMError(f"unknown LLM {kind!r} (choose auto, ollama, openai or embedded)")


async def open_llm(settings: "LLMSettings", say=print) -> LLMBackend:
    """The LLM the settings name, warmed up."""
    return await pick_llm(LLMChoice.from_settings(settings), say=say)


@asynccontextmanager
async def live_llm(settings: "LLMSettings", say=print) -> AsyncIterator[LLMBackend | None]:
    """`s5 replay` and `s5 bench e2e`: None for backend "replay" (the script's own answers), else the LLM the
    settings name, closed on the way out."""
    if settings.backend == "replay":
        yield None
        return
    llm = await open_llm(settings, say=say)
    try:
        yield llm
    finally:
        await llm.close()


async def pick_llm(choice: LLMChoice, say=print) -> LLMBackend:
    """The chosen LLM, warmed up. auto: Ollama if it answers with the model pulled, else the embedded model (saying
    which); openai: the OpenAI-compatible server at `choice.openai_url`."""
    kind = choice.kind
    if kind == "openai":
        llm = choice.new()
        try:
            await llm.warm_up()
        except LLMError:
            await llm.close()
            raise
        say(f"LLM: {llm.model} at {llm.base_url} (OpenAI-compatible)")
        return llm
    if kind in ("auto", "ollama"):
        try:
            ollama = choice.new("ollama")
        except LLMError:
            if kind == "ollama":
                raise
            ollama = None
        if kind == "ollama" or (ollama is not None and await ollama.available()):
            await ollama.warm_up()
            say(f"LLM: Ollama {choice.ollama_model} at {choice.ollama_host}")
            return ollama
        if ollama is not None:
            await ollama.close()
        say(f"LLM: Ollama with {choice.ollama_model} is not reachable at {choice.ollama_host}; using the embedded "
            "Gemma 3 270M")
    llm = choice.new("embedded")
    await llm.warm_up()
    if kind == "embedded":
        say("LLM: embedded Gemma 3 270M")
    return llm


async def chat(llm: LLMBackend, bundles: dict[str, TTSBundle], sink, config: AgentConfig, console: Console,
               out_dir: Path | None, listener: Listener | None = None) -> int:
    """Type a line (or, with a listener, say it), hear the answer. A line typed while the agent speaks interrupts
    it (barge-in; piped input waits its turn instead); Ctrl-C interrupts the answer, or quits at the prompt; end of
    input quits after the last answer. Spoken input: the turn starts on the VAD's guess that the user has finished
    and stays silent until the pause is long enough to be sure (or is dropped if the user goes on); speaking over
    the agent, louder than its echo (`listener.echo`), interrupts it; without an echo gate, listening is
    half-duplex (the microphone is ignored while the agent speaks)."""
    agent = Agent(llm, bundles, sink, config, on_piece=lambda text: console.print(text, end="", style="cyan", markup=False, highlight=False))
    lines: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def read_lines() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line.rstrip("\n"))
        if listener is None:  # end of typed input quits; while listening, Ctrl-C does
            loop.call_soon_threadsafe(lines.put_nowait, None)

    # a daemon thread, not the loop's executor: asyncio.run joins the executor's threads at exit, and this one sits in
    # a read of the terminal until Enter (Ctrl-C at the prompt hung there)
    threading.Thread(target=read_lines, name="stdin", daemon=True).start()
    speaking = False
    spoken = SpokenTurns(agent, full_duplex=listener is not None and listener.echo is not None,
                         say=lambda message: console.print(message))

    async def hear() -> None:
        async for event in listener.events():
            line = spoken.on_event(event, speaking)
            if line is not None:
                lines.put_nowait(line)

    hearing = asyncio.create_task(hear()) if listener is not None else None
    interactive = sys.stdin.isatty()

    def on_ctrl_c() -> None:  # interrupt the answer; at the prompt, quit
        if speaking:
            agent.interrupt()
            console.print("\n[yellow](interrupted)[/]")
        else:
            lines.put_nowait(None)

    try:
        import signal

        loop.add_signal_handler(signal.SIGINT, on_ctrl_c)
    except (NotImplementedError, RuntimeError):
        pass
    console.print("[bold]s5 chat[/] - type a message and press Enter (a new message interrupts; Ctrl-D quits)")
    next_line: str | None = await lines.get()
    while next_line is not None:
        heard = next_line if isinstance(next_line, HeardLine) else None
        user = heard.text if heard else next_line.strip()
        next_line = ""
        if not user:
            next_line = await lines.get()
            continue
        console.print(f"[bold]you{' (spoken)' if heard else ''}:[/] ", end="")
        console.print(user, markup=False, highlight=False)
        console.print("[bold]agent:[/] ", end="")
        speaking = True
        turn = asyncio.create_task(spoken.run_turn(user, heard))
        reader = asyncio.create_task(lines.get())
        done, _ = await asyncio.wait({turn, reader}, return_when=asyncio.FIRST_COMPLETED)
        if reader in done and not turn.done() and reader.result() is not None and (interactive or isinstance(reader.result(), HeardLine)):
            agent.interrupt()  # barge-in: a newly typed or spoken line interrupts (piped lines wait their turn)
        record = await turn
        speaking = False
        console.print()
        if record.retracted:
            console.print("[dim](you went on speaking: that answer was dropped unheard)[/]")
        if record.error:
            console.print(f"[yellow]{record.error}[/]")
        console.print(record.summary_line(), style="dim", markup=False, highlight=False)
        console.print(record.timeline())
        if out_dir is not None and isinstance(sink, WavSink):
            sink.save(out_dir / f"turn_{record.turn:03d}.wav")
        next_line = await reader  # the line that interrupted, or the next one typed
    if hearing is not None:
        hearing.cancel()
    return 0


@dataclass
class GuessTurn:
    """A turn started on the VAD's guess: which utterance (its speech span) and whether its end is confirmed."""
    span: tuple[int, int]
    confirmed: bool = False


def span_of(heard: HeardLine) -> tuple[int, int]:
    return heard.speech_start_ns, heard.speech_end_ns


class SpokenTurns:
    """Turn-taking for spoken input, shared by `s5 chat --voice` and `s5 bench voice`. `on_event` takes the
    listener's events and returns the line a turn should start on (or None): a guess starts a turn held silent;
    its final line confirms it (the answer plays) and `SpeechResumed` retracts it; `UserSpeaking` while the agent
    speaks is a voice barge-in (full duplex only: the listener's echo gate has told the user from the agent)."""

    def __init__(self, agent: Agent, full_duplex: bool, say=lambda message: None):
        self.agent = agent
        self.full_duplex = full_duplex
        self.say = say
        self.guess: GuessTurn | None = None  # the spoken line a turn starts (or runs) on, until its end is confirmed
        self.barge_ins = 0

    def on_event(self, event: HeardLine | SpeechResumed | UserSpeaking, speaking: bool) -> HeardLine | None:
        guess = self.guess
        if isinstance(event, UserSpeaking):
            if speaking and self.full_duplex and (guess is None or guess.confirmed):
                self.barge_ins += 1
                self.agent.interrupt()
                self.say("\n[yellow](interrupted by voice)[/]")
            return None
        if isinstance(event, SpeechResumed):
            if guess is not None and not guess.confirmed:
                self.agent.retract()  # the user went on: the turn started on the guess goes, unheard
                self.guess = None
            return None
        replaces_guess = False
        if not event.guess and guess is not None and not guess.confirmed:
            if guess.span == span_of(event):
                guess.confirmed = True
                self.agent.confirm()  # the pause was the end: the answer may play
                return None
            self.agent.retract()  # the utterance ended elsewhere (e.g. cut at the length limit): not what was guessed
            self.guess, replaces_guess = None, True
        if speaking and not self.full_duplex and not replaces_guess:
            return None  # half-duplex: what the microphone hears now is mostly the agent itself
        if event.cut:
            self.say("[yellow](you spoke past the length limit: cut there)[/]")
        if not event.text:
            if not event.guess:
                self.say("[dim](heard speech, but no words in it: nothing sent)[/]")
            return None
        self.guess = GuessTurn(span_of(event)) if event.guess else None
        return event

    async def run_turn(self, user: str, heard: HeardLine | None = None) -> TurnRecord:
        """Run a turn; one started on a guess is held silent unless its end was confirmed before it began (decided
        when the task starts, so a confirmation that comes first is never missed)."""
        guess = self.guess if heard is not None and heard.guess else None
        return await self.agent.run_turn(user, heard=heard, held=guess is not None and not guess.confirmed)
