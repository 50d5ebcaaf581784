"""What the `s5 chat`, `s5 replay` and `s5 bench e2e` commands run."""
from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console

from audio_io.sinks import ClockSink, WavSink
from llm.base import LLMBackend, LLMError
from llm.replay import ReplayLLM, ReplayScript
from tts.inference.streaming import MODES, load_bundle
from tts.inference.synthesis import SynthesisConfig, TTSBundle

from .orchestrator import Agent, AgentConfig
from .records import TurnRecord

DEFAULT_BENCH_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "bench_e2e.yaml"


def load_bundles(modes: list[str], s5_model: Path | None = None, t5_model: Path | None = None) -> dict[str, TTSBundle]:
    bundles: dict[str, TTSBundle] = {}
    cache: dict[str, TTSBundle] = {}
    for mode in modes:
        key = "s5" if mode == "s5" else "t5"
        if key not in cache:
            cache[key] = load_bundle(mode, s5_model if key == "s5" else t5_model)
        bundles[mode] = cache[key]
    return bundles


async def pick_llm(kind: str, ollama_model: str, ollama_host: str, say=print, keep_alive: str = "30m") -> LLMBackend:
    """auto: Ollama if it answers with the model pulled, else the embedded model (saying which)."""
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
        raise LLMError(f"unknown LLM {kind!r} (choose auto, ollama or embedded)")
    from llm.embedded import EmbeddedLLM

    llm = EmbeddedLLM()
    await llm.warm_up()
    if kind == "embedded":
        say("LLM: embedded Gemma 3 270M")
    return llm


# ---- chat ----------------------------------------------------------------------------------------------------
async def chat(llm: LLMBackend, bundles: dict[str, TTSBundle], sink, config: AgentConfig, console: Console,
               out_dir: Path | None) -> int:
    """Type a line, hear the answer. A line typed while the agent speaks interrupts it (barge-in; piped input
    waits its turn instead); Ctrl-C interrupts the answer, or quits at the prompt; end of input quits after the
    last answer."""
    agent = Agent(llm, bundles, sink, config, on_piece=lambda text: console.print(text, end="", style="cyan", markup=False, highlight=False))
    lines: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    def read_lines() -> None:
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line.rstrip("\n"))
        loop.call_soon_threadsafe(lines.put_nowait, None)

    loop.run_in_executor(None, read_lines)
    speaking = False
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
        user = next_line.strip()
        next_line = ""
        if not user:
            next_line = await lines.get()
            continue
        console.print(f"[bold]you:[/] {user}")
        console.print("[bold]agent:[/] ", end="")
        speaking = True
        turn = asyncio.create_task(agent.run_turn(user))
        reader = asyncio.create_task(lines.get())
        done, _ = await asyncio.wait({turn, reader}, return_when=asyncio.FIRST_COMPLETED)
        if reader in done and not turn.done() and reader.result() is not None and interactive:
            agent.interrupt()  # barge-in: a newly typed line interrupts (piped lines wait their turn)
        record = await turn
        speaking = False
        console.print()
        if record.error:
            console.print(f"[yellow]{record.error}[/]")
        console.print(record.summary_line(), style="dim", markup=False, highlight=False)
        console.print(record.timeline())
        if out_dir is not None and isinstance(sink, WavSink):
            sink.save(out_dir / f"turn_{record.turn:03d}.wav")
        next_line = await reader  # the line that interrupted, or the next one typed
    return 0


# ---- replay and the e2e benchmark ----------------------------------------------------------------------------
@dataclass
class ReplayResult:
    script: str
    mode: str
    records: list[TurnRecord]
    wavs: list[Path]


async def replay(script: ReplayScript, bundles: dict[str, TTSBundle], mode: str, out_dir: Path | None,
                 synthesis: SynthesisConfig | None = None, pace: bool = False, progress=None) -> ReplayResult:
    """Every turn of the script through the real orchestrator; one WAV per turn, records in latency.jsonl."""
    rate = next(iter(bundles.values())).codec.sample_rate
    sink = WavSink(rate, out_dir / "turn.wav" if out_dir else "turn.wav", pace=pace) if out_dir else ClockSink(rate, pace=pace)
    records_path = out_dir / "latency.jsonl" if out_dir else None
    agent = Agent(ReplayLLM(script), bundles, sink, AgentConfig(tts_mode=mode, synthesis=synthesis or SynthesisConfig(),
                                                                 records_path=records_path))
    records, wavs = [], []
    task = progress.add_task(f"{script.name} ({mode})", total=len(script.turns)) if progress else None
    for turn in script.turns:
        records.append(await agent.run_turn(turn.user))
        if out_dir is not None:
            wavs.append(sink.save(out_dir / f"{mode}_turn_{len(records):02d}.wav"))
        if progress:
            progress.advance(task)
    return ReplayResult(script.name, mode, records, wavs)


def summarize_records(records: list[TurnRecord]) -> dict:
    def pct(values: list[float], q: float) -> float | None:
        return round(float(np.percentile(values, q)), 1) if values else None

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
                    seed: int = 0, progress=None) -> dict:
    """The same replayed LLM stream through every mode, turn by turn interleaved so machine noise hits all alike."""
    by_mode: dict[str, list[TurnRecord]] = {m: [] for m in modes}
    task = progress.add_task("bench e2e", total=len(script.turns) * len(modes)) if progress else None
    for i, turn in enumerate(script.turns):
        single = ReplayScript(script.name, [turn], script.first_token_ms, script.tokens_per_second)
        for mode in modes:
            result = await replay(single, bundles, mode, None, SynthesisConfig(seed=seed + i))
            for record in result.records:
                record.turn = i + 1  # the script's turn, not the one-turn replay's
            by_mode[mode] += result.records
            if progress:
                progress.advance(task)
    out: dict = {"script": script.name, "first_token_ms": script.first_token_ms, "tokens_per_second": script.tokens_per_second}
    for mode in modes:
        out[mode] = summarize_records(by_mode[mode])
    if "s5" in modes and "t5" in modes and out["s5"]["e2e_p50_ms"] and out["t5"]["e2e_p50_ms"]:
        out["ratio_e2e_s5_over_t5"] = round(out["s5"]["e2e_p50_ms"] / out["t5"]["e2e_p50_ms"], 3)
    return out
