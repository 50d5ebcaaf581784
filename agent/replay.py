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


@dataclass
class ScriptOutcome:
    """One script of a many-script replay: its turns' records (JSON), or why it failed."""
    script: str
    records: list[dict]
    error: str | None = None
    where: str = ""  # what played it: the Ray node's id, or this host's name


def play_scripts(scripts: list[ReplayScript], settings, out_dir: Path | None, save_wavs: bool) -> list[ScriptOutcome]:
    """Play several scripts in this process, the voices loaded once (a Ray task runs this, as does a local run of
    more than one script); a failing script is reported and the next one still plays."""
    from agent.chat import live_llm, load_bundles

    where = _where()

    mode = settings.tts.mode
    bundles = load_bundles([mode], vocoder=settings.tts.vocoder)
    outcomes = []
    for script in scripts:
        folder = out_dir / script.name if out_dir is not None else None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

        async def run(script=script, folder=folder) -> ReplayResult:
            async with live_llm(settings.llm, say=lambda m: None) as llm:
                return await replay(script, bundles, AgentConfig.from_settings(settings, mode), folder,
                                    save_wavs=save_wavs, llm=llm)

        try:
            result = asyncio.run(run())
            outcomes.append(ScriptOutcome(script.name, [r.to_json() for r in result.records], where=where))
        except Exception as error:  # noqa: BLE001 - reported by the script's name; the others go on
            outcomes.append(ScriptOutcome(script.name, [], f"{type(error).__name__}: {error}", where))
    return outcomes


def _where() -> str:
    import socket
    import sys

    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    return socket.gethostname()


def play_on_ray(scripts: list[ReplayScript], settings, address: str, scripts_per_task: int) -> list[ScriptOutcome]:
    """The scripts as Ray tasks across the cluster at `address` ("local": start one here), `scripts_per_task` to a
    task (each task loads the voices once); the scripts travel with the tasks, so no node needs the files. A task
    that dies is reported by its scripts' names; the other tasks still finish."""
    import ray

    local = address == "local"
    ray.init(address=None if local else address, include_dashboard=False if local else None,
             logging_level="WARNING", log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(play_scripts)
        groups = [scripts[i : i + scripts_per_task] for i in range(0, len(scripts), scripts_per_task)]
        futures = [task.remote(group, settings, None, False) for group in groups]
        outcomes = []
        for group, future in zip(groups, futures):
            try:
                outcomes.extend(ray.get(future))
            except Exception as error:  # noqa: BLE001 - the task's process died: its scripts failed
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                outcomes.extend(ScriptOutcome(s.name, [], f"the task failed: {reason}") for s in group)
        return outcomes
    finally:
        if local:
            ray.shutdown()


def write_outcomes(outcomes: list[ScriptOutcome], path: Path) -> None:
    """Every turn's record, each with its script's name, into one latency.jsonl."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for outcome in outcomes:
            for record in outcome.records:
                f.write(json.dumps({"script": outcome.script, **record}) + "\n")


def outcome_rows(outcomes: list[ScriptOutcome]) -> list[dict]:
    """The summary table: per script its turns, first sound p50 / p95, underruns, errors (or why it failed); and
    a last row over every turn."""
    def row(name: str, records: list[dict], error: str | None = None, where: str = "") -> dict:
        e2e = [r["e2e_ms"] for r in records if r.get("e2e_ms") is not None]
        return {"script": name, "turns": len(records), "e2e_p50_ms": percentile(e2e, 50),
                "e2e_p95_ms": percentile(e2e, 95), "underruns": sum(r.get("underruns", 0) for r in records),
                "errors": sum(bool(r.get("error")) for r in records), "failed": error, "where": where}

    rows = [row(o.script, o.records, o.error, o.where) for o in outcomes]
    rows.append(row("all", [r for o in outcomes for r in o.records]))
    return rows
