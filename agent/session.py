"""What the `s5 chat`, `s5 replay` and `s5 bench e2e` commands run."""
from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from audio_io.sinks import ClockSink, WavSink
from llm.base import LLMBackend, LLMError
from llm.replay import ReplayLLM, ReplayScript
from tts.inference.streaming import MODES, load_bundle
from tts.inference.synthesis import SynthesisConfig, TTSBundle
from tts.paths import EXAMPLES

from .listen import HeardLine, Listener, SpeechResumed, UserSpeaking
from .orchestrator import Agent, AgentConfig
from .records import TurnRecord

DEFAULT_BENCH_SCRIPT = EXAMPLES / "bench_e2e.yaml"


def load_bundles(modes: list[str], s5_model: Path | None = None, t5_model: Path | None = None,
                 vocoder: str | None = None) -> dict[str, TTSBundle]:
    """The voices the modes run (s5, or the full-context model for t5 and sentence), each loaded once; `vocoder`
    replaces the codec's own ("auto")."""
    bundles: dict[str, TTSBundle] = {}
    cache: dict[str, TTSBundle] = {}
    for mode in modes:
        key = "s5" if mode == "s5" else "t5"
        if key not in cache:
            cache[key] = load_bundle(mode, s5_model if key == "s5" else t5_model, vocoder=vocoder)
        bundles[mode] = cache[key]
    return bundles


async def pick_llm(kind: str, ollama_model: str, ollama_host: str, say=print, keep_alive: str = "30m",
                   openai_url: str | None = None, openai_model: str | None = None,
                   max_tokens: int | None = None) -> LLMBackend:
    """auto: Ollama if it answers with the model pulled, else the embedded model (saying which); openai: the
    OpenAI-compatible server at openai_url."""
    if kind == "openai":
        from llm.openai_backend import DEFAULT_URL, OpenAILLM

        llm = OpenAILLM(openai_model or "", openai_url or DEFAULT_URL, max_tokens=max_tokens)
        try:
            await llm.warm_up()
        except LLMError:
            await llm.close()
            raise
        say(f"LLM: {llm.model} at {llm.base_url} (OpenAI-compatible)")
        return llm
    if kind in ("auto", "ollama"):
        from llm.ollama_backend import OllamaLLM

        try:
            ollama = OllamaLLM(ollama_model, ollama_host, keep_alive=keep_alive)
        except LLMError:
            if kind == "ollama":
                raise
            ollama = None
        if kind == "ollama" or (ollama is not None and await ollama.available()):
            await ollama.warm_up()
            say(f"LLM: Ollama {ollama_model} at {ollama_host}")
            return ollama
        if ollama is not None:
            await ollama.close()
        say(f"LLM: Ollama with {ollama_model} is not reachable at {ollama_host}; using the embedded Gemma 3 270M")
    elif kind != "embedded":
        raise LLMError(f"unknown LLM {kind!r} (choose auto, ollama, openai or embedded)")
    from llm.embedded import EmbeddedLLM

    llm = EmbeddedLLM()
    await llm.warm_up()
    if kind == "embedded":
        say("LLM: embedded Gemma 3 270M")
    return llm


# ---- chat ----------------------------------------------------------------------------------------------------
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


# ---- replay and the e2e benchmark ----------------------------------------------------------------------------
@dataclass
class ReplayResult:
    script: str
    mode: str
    records: list[TurnRecord]
    wavs: list[Path]
    rss_mb: list[float]  # resident memory after each turn


def resident_mb() -> float:
    """This process's resident memory now (Linux /proc; 0 elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0.0
    import os

    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def soak_summary(result: ReplayResult, warmup_fraction: float = 0.1) -> dict:
    """Long replays: does latency drift or memory grow once warm? Compares the first and last quarter of the
    turns after warm-up (the first 10%, at least 5 turns)."""
    warm = max(5, round(warmup_fraction * len(result.records)))
    records, rss = result.records[warm:], result.rss_mb[warm - 1 :]
    if len(records) < 8:
        return {"turns": len(result.records), "note": "too few turns after warm-up for a soak figure"}
    quarter = len(records) // 4
    early = pct([r.e2e_ms for r in records[:quarter] if r.e2e_ms is not None], 50)
    late = pct([r.e2e_ms for r in records[-quarter:] if r.e2e_ms is not None], 50)
    return {
        "turns": len(result.records), "warmup_turns": warm,
        "rss_mb_after_warmup": round(rss[0], 1), "rss_mb_end": round(rss[-1], 1), "rss_mb_max": round(max(rss), 1),
        "rss_growth_pct": round(100 * (rss[-1] - rss[0]) / rss[0], 2) if rss[0] else None,
        "e2e_p50_ms_first_quarter": early, "e2e_p50_ms_last_quarter": late,
        "e2e_drift_ms": round(late - early, 1) if early is not None and late is not None else None,
        "underruns": sum(r.underruns for r in result.records), "errors": sum(bool(r.error) for r in result.records),
    }


async def replay(script: ReplayScript, bundles: dict[str, TTSBundle], mode: str, out_dir: Path | None,
                 synthesis: SynthesisConfig | None = None, pace: bool = False, progress=None,
                 save_wavs: bool = True, llm: LLMBackend | None = None) -> ReplayResult:
    """Every turn of the script through the real orchestrator; one WAV per turn, records in latency.jsonl. With
    `llm`, the user lines go to that live LLM instead of replaying the script's answers."""
    rate = next(iter(bundles.values())).codec.sample_rate
    sink = WavSink(rate, out_dir / "turn.wav" if out_dir else "turn.wav", pace=pace) if out_dir else ClockSink(rate, pace=pace)
    records_path = out_dir / "latency.jsonl" if out_dir else None
    agent = Agent(llm or ReplayLLM(script), bundles, sink, AgentConfig(tts_mode=mode, synthesis=synthesis or SynthesisConfig(),
                                                                 records_path=records_path))
    records, wavs, rss = [], [], []
    task = progress.add_task(f"{script.name} ({mode})", total=len(script.turns)) if progress else None
    for turn in script.turns:
        records.append(await agent.run_turn(turn.user))
        if out_dir is not None and save_wavs:
            wavs.append(sink.save(out_dir / f"{mode}_turn_{len(records):02d}.wav"))
        elif isinstance(sink, WavSink):
            sink.clear_recording()
        rss.append(resident_mb())
        if progress:
            progress.advance(task)
    return ReplayResult(script.name, mode, records, wavs, rss)


def pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if values else None


async def bench_barge_in(script: ReplayScript, bundle: TTSBundle, after_ms: float = 400.0, seed: int = 0,
                         progress=None, output: str = "null") -> dict:
    """Every turn of the script in s5, played in real time and interrupted `after_ms` after its first audible
    sample: how long from the interruption until the sink is silent. output "device" plays through the sound card
    (its output latency counts); "null" is the simulated player."""
    from audio_io.sinks import open_sink

    rate = bundle.codec.sample_rate
    figures = []
    device = open_sink("device", rate) if output == "device" else None
    task = progress.add_task("bench barge-in", total=len(script.turns)) if progress else None
    for i, turn in enumerate(script.turns):
        sink = device or ClockSink(rate, pace=True)
        single = ReplayScript(script.name, [turn], script.first_token_ms, script.tokens_per_second)
        agent = Agent(ReplayLLM(single), {"s5": bundle}, sink, AgentConfig(tts_mode="s5", synthesis=SynthesisConfig(seed=seed + i)))
        sink.begin_turn()  # no stale stats from the previous turn while this one starts
        running = asyncio.create_task(agent.run_turn(turn.user))
        while not running.done() and (sink.stats.first_audible_ns is None
                                      or time.perf_counter_ns() < sink.stats.first_audible_ns + after_ms * 1e6):
            await asyncio.sleep(0.005)
        agent.interrupt()
        record = await running
        if record.barge_in_ms is not None:
            figures.append(record.barge_in_ms)
        if progress:
            progress.advance(task)
    if device is not None:
        device.close()
    return {"output": output, "after_first_audible_ms": after_ms, "ms_p50": pct(figures, 50), "ms_p95": pct(figures, 95),
            "ms_max": max(figures) if figures else None, "turns": len(figures)}


def summarize_records(records: list[TurnRecord]) -> dict:
    e2e = [r.e2e_ms for r in records if r.e2e_ms is not None]
    chunk = [r.e2e_chunk_ms for r in records if r.e2e_chunk_ms is not None]
    first_chunk = [(r.first_audio_chunk - r.word_k1_arrived) / 1e6 for r in records
                   if r.first_audio_chunk is not None and r.word_k1_arrived is not None]
    over_floor = [r.e2e_minus_floor_ms for r in records if r.e2e_minus_floor_ms is not None]
    audio = sum(r.audio_s for r in records)
    compute = sum((r.rtf or 0) * r.audio_s for r in records)
    return {
        "e2e_p50_ms": pct(e2e, 50), "e2e_p95_ms": pct(e2e, 95),
        "e2e_chunk_p50_ms": pct(chunk, 50), "e2e_chunk_p95_ms": pct(chunk, 95),
        "first_chunk_ms_p50": pct(first_chunk, 50),
        "e2e_minus_floor_ms_p50": pct(over_floor, 50), "e2e_minus_floor_ms_p95": pct(over_floor, 95),
        "rtf": round(compute / audio, 3) if audio else None,
        "underruns": sum(r.underruns for r in records), "underrun_ms": round(sum(r.underrun_ms for r in records), 1),
        "turns": len(records), "errors": sum(bool(r.error) for r in records),
        "underrun_turns": [{"turn": r.turn, "user": r.user, "gaps": r.gaps} for r in records if r.underruns],
    }


async def bench_e2e(script: ReplayScript, bundles: dict[str, TTSBundle], modes: tuple[str, ...] = MODES,
                    seed: int = 0, progress=None, barge_in_output: str = "null", llm: LLMBackend | None = None) -> dict:
    """The same replayed LLM stream through every mode, turn by turn interleaved so machine noise hits all alike.
    With a live `llm` each mode asks it the script's user lines itself (the replies, and their timing, differ)."""
    by_mode: dict[str, list[TurnRecord]] = {m: [] for m in modes}
    task = progress.add_task("bench e2e", total=len(script.turns) * len(modes)) if progress else None
    for i, turn in enumerate(script.turns):
        single = ReplayScript(script.name, [turn], script.first_token_ms, script.tokens_per_second)
        for mode in modes:
            result = await replay(single, bundles, mode, None, SynthesisConfig(seed=seed + i), llm=llm)
            for record in result.records:
                record.turn = i + 1  # the script's turn, not the one-turn replay's
            by_mode[mode] += result.records
            if progress:
                progress.advance(task)
    out: dict = {"script": script.name, "first_token_ms": script.first_token_ms, "tokens_per_second": script.tokens_per_second,
                 "llm": llm.name if llm else "replay"}
    for mode in modes:
        out[mode] = summarize_records(by_mode[mode])
    if "s5" in modes:
        out["barge_in"] = await bench_barge_in(script, bundles["s5"], seed=seed, progress=progress, output=barge_in_output)
    if "s5" in modes and "t5" in modes and out["s5"]["e2e_p50_ms"] and out["t5"]["e2e_p50_ms"]:
        out["ratio_e2e_s5_over_t5"] = round(out["s5"]["e2e_p50_ms"] / out["t5"]["e2e_p50_ms"], 3)
    return out
