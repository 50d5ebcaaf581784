"""`s5 bench e2e`: the same LLM stream through S5, T5 and sentence mode, turn by turn interleaved, and the
barge-in timing."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from agent.orchestrator import Agent, AgentConfig
from agent.records import TurnRecord
from agent.replay import replay
from audio_io.sinks import ClockSink
from llm.base import LLMBackend
from llm.replay import ReplayLLM, ReplayScript
from tts.eval.stream_bench import percentile as pct
from tts.inference.streaming import MODES
from tts.inference.synthesis import SynthesisConfig, TTSBundle
from tts.paths import EXAMPLES

DEFAULT_BENCH_SCRIPT = EXAMPLES / "bench_e2e.yaml"


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
    first_chunk = [ms for r in records if (ms := r.ms_between("word_k1_arrived", "first_audio_chunk")) is not None]
    over_floor = [r.e2e_minus_floor_ms for r in records if r.e2e_minus_floor_ms is not None]
    audio = sum(r.synthesis.audio_s for r in records)
    compute = sum((r.rtf or 0) * r.synthesis.audio_s for r in records)
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
                    seed: int = 0, progress=None, barge_in_output: str = "null", llm: LLMBackend | None = None,
                    records: dict[str, list[TurnRecord]] | None = None, barge_in: bool = True,
                    config: AgentConfig | None = None) -> dict:
    """The same replayed LLM stream through every mode, turn by turn interleaved so machine noise hits all alike.
    With a live `llm` each mode asks it the script's user lines itself (the replies, and their timing, differ).
    `barge_in`: also time how fast s5 stops when the user talks over it. `config`: the turn settings (sampling,
    pacing; each turn i samples with seed + i)."""
    config = config or AgentConfig()
    by_mode: dict[str, list[TurnRecord]] = {m: [] for m in modes}
    task = progress.add_task("bench e2e", total=len(script.turns) * len(modes)) if progress else None
    for i, turn in enumerate(script.turns):
        single = ReplayScript(script.name, [turn], script.first_token_ms, script.tokens_per_second)
        for mode in modes:
            turn_config = replace(config, tts_mode=mode, synthesis=replace(config.synthesis, seed=seed + i))
            result = await replay(single, bundles, turn_config, None, llm=llm)
            for record in result.records:
                record.turn = i + 1  # the script's turn, not the one-turn replay's
            by_mode[mode] += result.records
            if progress:
                progress.advance(task)
    out: dict = {"script": script.name, "first_token_ms": script.first_token_ms, "tokens_per_second": script.tokens_per_second,
                 "llm": llm.name if llm else "replay"}
    for mode in modes:
        out[mode] = summarize_records(by_mode[mode])
    if records is not None:  # the caller keeps every turn's record (`--plot`)
        records.update(by_mode)
    if "s5" in modes and barge_in:
        out["barge_in"] = await bench_barge_in(script, bundles["s5"], seed=seed, progress=progress, output=barge_in_output)
    if "s5" in modes and "t5" in modes and out["s5"]["e2e_p50_ms"] and out["t5"]["e2e_p50_ms"]:
        out["ratio_e2e_s5_over_t5"] = round(out["s5"]["e2e_p50_ms"] / out["t5"]["e2e_p50_ms"], 3)
    return out
