"""`s5 replay`: a scripted conversation through the real orchestrator, and the soak figures of long replays."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path

from agent.orchestrator import Agent, AgentConfig
from agent.records import TurnRecord
from audio_io.sinks import ClockSink, WavSink
from llm.base import LLMBackend
from llm.replay import ReplayLLM, ReplayScript
from tts.eval.stream_bench import percentile
from tts.inference.synthesis import TTSBundle


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
    early = percentile([r.e2e_ms for r in records[:quarter] if r.e2e_ms is not None], 50)
    late = percentile([r.e2e_ms for r in records[-quarter:] if r.e2e_ms is not None], 50)
    return {
        "turns": len(result.records), "warmup_turns": warm,
        "rss_mb_after_warmup": round(rss[0], 1), "rss_mb_end": round(rss[-1], 1), "rss_mb_max": round(max(rss), 1),
        "rss_growth_pct": round(100 * (rss[-1] - rss[0]) / rss[0], 2) if rss[0] else None,
        "e2e_p50_ms_first_quarter": early, "e2e_p50_ms_last_quarter": late,
        "e2e_drift_ms": round(late - early, 1) if early is not None and late is not None else None,
        "underruns": sum(r.underruns for r in result.records), "errors": sum(bool(r.error) for r in result.records),
    }


async def _interrupt_after(agent: Agent, sink: ClockSink, seconds: float) -> None:
    """A scripted barge-in: the user speaks `seconds` after the reply's first audible sample."""
    while sink.stats.first_audible_ns is None:
        await asyncio.sleep(0.005)
    await asyncio.sleep(max(0.0, (sink.stats.first_audible_ns - time.perf_counter_ns()) / 1e9 + seconds))
    agent.interrupt()


async def replay(script: ReplayScript, bundles: dict[str, TTSBundle], config: AgentConfig, out_dir: Path | None,
                 pace: bool = False, progress=None, save_wavs: bool = True,
                 llm: LLMBackend | None = None) -> ReplayResult:
    """Every turn of the script through the real orchestrator, with the turn settings `config` (its records go to
    out_dir/latency.jsonl); one WAV per turn. With `llm`, the user lines go to that live LLM instead of replaying
    the script's answers."""
    rate = next(iter(bundles.values())).codec.sample_rate
    pace = pace or any(turn.interrupt_after_s is not None for turn in script.turns)  # a barge-in needs real time
    sink = WavSink(rate, out_dir / "turn.wav" if out_dir else "turn.wav", pace=pace) if out_dir else ClockSink(rate, pace=pace)
    mode = config.tts_mode
    config = replace(config, records_path=out_dir / "latency.jsonl" if out_dir else None)
    agent = Agent(llm or ReplayLLM(script), bundles, sink, config)
    records, wavs, rss = [], [], []
    task = progress.add_task(f"{script.name} ({mode})", total=len(script.turns)) if progress else None
    for turn in script.turns:
        barge_in = None
        if turn.interrupt_after_s is not None:
            barge_in = asyncio.create_task(_interrupt_after(agent, sink, turn.interrupt_after_s))
        records.append(await agent.run_turn(turn.user))
        if barge_in is not None:
            barge_in.cancel()
        if out_dir is not None and save_wavs:
            wavs.append(sink.save(out_dir / f"{mode}_turn_{len(records):02d}.wav"))
        elif isinstance(sink, WavSink):
            sink.clear_recording()
        rss.append(resident_mb())
        if progress:
            progress.advance(task)
    return ReplayResult(script.name, mode, records, wavs, rss)
