"""`s5 bench e2e | serve | voice`: the command lines of the agent's benchmarks."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agent.settings import add_settings_arguments
from audio_io.errors import UserError
from tts.cli import err, print_result, progress_bar


def _bench_serve(args: argparse.Namespace) -> int:
    import asyncio

    from agent.settings import settings_for

    from agent.bench.serve import bench_serve
    from agent.chat import load_bundles
    from tts.inference.batching import RENDER_MODES, StreamWorker
    from tts.cli import read_sentences
    from tts.eval.stream_bench import BENCH_SENTENCES

    try:
        counts = [int(n) for n in args.sessions.split(",") if n.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UserError(f"--sessions {args.sessions}: comma-separated counts of at least 1, e.g. 1,2,4")
    import torch

    settings = settings_for("bench serve", args)
    torch.set_num_threads(1)  # as s5 serve: the sessions run on the worker's threads (--threads)
    sentences = read_sentences(args.sentences or BENCH_SENTENCES)[: args.limit]
    urls = [u.strip() for u in args.url.split(",") if u.strip()] if args.url else [None]
    renders = [m.strip() for m in args.renders.split(",") if m.strip()] if args.renders else [None]
    if args.idle < 0:
        raise UserError(f"--idle {args.idle}: at least 0")
    if unknown := [m for m in renders if m is not None and m not in RENDER_MODES]:
        raise UserError(f"--renders {','.join(unknown)}: each one of {', '.join(RENDER_MODES)}")
    if len(urls) > 1 and len(renders) > 1:
        raise UserError("side by side is either several --url or several --renders, not both")
    if (len(urls) > 1 or len(renders) > 1) and args.plot:
        raise UserError("--plot draws one server's runs: give one --url and one --renders")
    if args.renders and (args.url or args.no_batch):
        raise UserError("--renders sets the worker of the server this bench starts: no --url, no --no-batch")
    # warmed for the thread counts the renders will run on (each mode's, when several are compared)
    render_threads = [1] if args.no_batch else \
        sorted({StreamWorker.for_renders(args.threads, mode).render_threads for mode in renders})
    bundles = None if args.url else load_bundles(["s5", "t5"], vocoder=settings.tts.vocoder,
                                                  render_threads=render_threads[0])
    for bundle in (bundles or {}).values():
        for threads in render_threads[1:]:
            bundle.warm_up(threads)

    def measure(url, counts, progress, mode: str | None = None):
        return asyncio.run(bench_serve(bundles, sentences, counts, args.model, progress,
                                       batch_decode=not args.no_batch, worker_threads=args.threads,
                                       url=url, token=args.token, idle=args.idle, renders=mode, spread=args.spread))

    with progress_bar() as progress:
        if len(urls) == 1 and len(renders) == 1:
            result = measure(urls[0], counts, progress, renders[0])
        else:  # side by side: each session count on every server (or worker) in turn, so that drift hits them alike
            by_server: dict = {}
            for n in counts:
                for url in urls:
                    for mode in renders:
                        by_server.setdefault((url, mode), []).append(measure(url, [n], None, mode))
            result = {"servers": [{**parts[0], "runs": [p["runs"][0] for p in parts],
                                   "streams_real_time": max((p["streams_real_time"] for p in parts), default=0)}
                                  for parts in by_server.values()]}
    if args.plot:
        from agent.bench.plots import plot_serve

        err.print(f"[green]picture: {plot_serve(result['runs'], args.plot)}[/]")
    if args.json:
        print(json.dumps(result))
    else:
        for server in result.get("servers", [result]):
            for run in server["runs"]:
                label = {"url": server["url"]} if server["url"] else {"renders": server["renders"]}
                Console().print({**label, **run})
    return 0


def _bench_voice(args: argparse.Namespace) -> int:
    import asyncio

    from agent.bench.e2e import DEFAULT_BENCH_SCRIPT
    from agent.bench.voice import bench_voice
    from agent.chat import load_bundles
    from agent.settings import settings_for
    from llm.replay import ReplayScript

    settings = settings_for("bench voice", args)
    script = ReplayScript.load(args.script or DEFAULT_BENCH_SCRIPT)
    if args.limit:
        script.turns = script.turns[: args.limit]
    bundles = load_bundles(["s5", "t5", "sentence"], vocoder=settings.tts.vocoder)
    with progress_bar() as progress:
        result = asyncio.run(bench_voice(script, bundles, progress=progress))
    print_result(result, args.json, "voice to voice")
    return 0


def _bench_e2e(args: argparse.Namespace) -> int:
    import asyncio

    from agent.bench.e2e import DEFAULT_BENCH_SCRIPT, bench_e2e
    from agent.chat import live_llm, load_bundles
    from agent.settings import settings_for
    from agent.orchestrator import AgentConfig
    from llm.replay import ReplayScript

    settings = settings_for("bench e2e", args)
    script = ReplayScript.load(args.script or DEFAULT_BENCH_SCRIPT)
    if args.first_token_ms is not None:
        script.first_token_ms = args.first_token_ms
    if args.tokens_per_second is not None:
        script.tokens_per_second = args.tokens_per_second
    bundles = load_bundles(["s5", "t5", "sentence"], args.s5_model, args.t5_model, vocoder=settings.tts.vocoder)

    async def run(progress) -> dict:
        async with live_llm(settings.llm, say=lambda m: err.print(f"[green]{m}[/]")) as llm:
            return await bench_e2e(script, bundles, progress=progress, barge_in_output=args.barge_in_output, llm=llm,
                                   records=records, config=AgentConfig.from_settings(settings, "s5"))

    records: dict = {}
    with progress_bar() as progress:
        result = asyncio.run(run(progress))
    if args.plot:
        from agent.bench.plots import plot_e2e

        err.print(f"[green]picture: {plot_e2e(records, args.plot)}[/]")
    if args.json:
        print(json.dumps(result))
        return 0
    source = (f"replayed LLM ({script.first_token_ms:.0f} ms to first token, {script.tokens_per_second:g} tokens/s)"
              if settings.llm.backend == "replay" else f"live LLM ({settings.llm.backend})")
    table = Table(title=f"E2E latency, {source}")
    for column in ("mode", "RTF", "first chunk p50 (ms)", "E2E p50 (ms)", "E2E p95 (ms)", "first chunk after request p50 (ms)", "underruns"):
        table.add_column(column, justify="right")
    for mode in ("s5", "t5", "sentence"):
        m = result[mode]
        table.add_row(mode, str(m["rtf"]), str(m["first_chunk_ms_p50"]), str(m["e2e_p50_ms"]), str(m["e2e_p95_ms"]),
                      str(m["e2e_chunk_p50_ms"]), str(m["underruns"]))
    Console().print(table)
    Console().print(f"E2E ratio S5 / T5: {result.get('ratio_e2e_s5_over_t5')}")
    if "barge_in" in result:
        b = result["barge_in"]
        Console().print(f"barge-in (s5, interrupted {b['after_first_audible_ms']:.0f} ms after the first sound): silent after "
                        f"{b['ms_p50']} ms p50, {b['ms_p95']} ms p95 ({b['turns']} turns)")
    return 0


def _bench_paper(args: argparse.Namespace) -> int:
    from agent.settings import settings_for
    from agent.bench.e2e import DEFAULT_BENCH_SCRIPT
    from agent.bench.paper import PAPER_MODELS, PaperModel, bench_paper
    from llm.replay import ReplayScript
    from tts.cli import read_sentences
    from tts.paths import CONFIGS

    settings = settings_for("bench paper", args)
    models = list(PAPER_MODELS)
    for extra in args.model:
        name, _, directory = extra.rpartition("=")
        if not name or not directory:
            raise UserError(f"--model {extra}: NAME=FOLDER, e.g. 'S5 k=2 (control)=runs/s5_k2/export'")
        models.append(PaperModel(name, Path(directory), "s5"))
    sentences = read_sentences(args.sentences or CONFIGS / "eval_replies.txt")[: args.limit]
    script = ReplayScript.load(DEFAULT_BENCH_SCRIPT)
    with progress_bar() as progress:
        result = bench_paper(models, sentences, script, progress, vocoder=settings.tts.vocoder)
    if args.json:
        print(json.dumps(result))
        return 0
    table = Table(title=f"Lookahead: {result['sentences']} unseen sentences; latency behind a replayed LLM "
                        f"({script.first_token_ms:.0f} ms to first token, {script.tokens_per_second:g} tokens/s)")
    columns = ("model", "WER %", "Distill-MOS", "first sound p50 / p95 (ms)", "E2E p50 / p95 (ms)", "underruns")
    for column in columns:
        table.add_column(column, justify="right")
    for row in result["models"]:
        table.add_row(row["model"], f"{row['wer']} (Piper {row['wer_reference']})", str(row["distillmos"]),
                      f"{row['first_sound_ms_p50']} / {row['first_sound_ms_p95']}", f"{row['e2e_ms_p50']} / {row['e2e_ms_p95']}",
                      str(row["underruns"]))
    Console().print(table)
    Console().print("first sound: after word k + 1 arrived (S5), after the reply ended (T5)")
    return 0


def register(bench_kinds) -> None:
    e2e = bench_kinds.add_parser("e2e", help="S5 vs T5 vs sentence mode on one replayed LLM stream (the paper's Table 4)")
    e2e.add_argument("--json", action="store_true")
    e2e.add_argument("--script", type=Path, default=None, help="replay YAML (default: examples/bench_e2e.yaml)")
    e2e.add_argument("--first-token-ms", type=float, default=None)
    e2e.add_argument("--tokens-per-second", type=float, default=None)
    add_settings_arguments(e2e, "bench e2e")
    e2e.add_argument("--s5-model", type=Path, default=None)
    e2e.add_argument("--t5-model", type=Path, default=None)
    e2e.add_argument("--barge-in-output", choices=["null", "device"], default="null",
                     help="time barge-in on the simulated player (default) or through the sound card")
    e2e.add_argument("--plot", type=Path, default=None, help="also draw the latency distributions and one turn's "
                     "timeline per mode into this PNG")
    e2e.set_defaults(func=_bench_e2e)
    serve_bench = bench_kinds.add_parser("serve", help="s5 serve under 1, 2, 4 ... concurrent clients: first audible, underruns, rtf")
    serve_bench.add_argument("--sessions", default="1,2,4,8,16")
    add_settings_arguments(serve_bench, "bench serve")
    serve_bench.add_argument("--no-batch", action="store_true", help="each session on a thread of its own (the comparison)")
    serve_bench.add_argument("--renders", default=None, help="where the server's worker renders "
                             "(tts/inference/batching.RENDER_MODES: inline or on a render thread, each stream alone "
                             "or -batched; default: as s5 serve); several, comma-separated: side by side, each count "
                             "with each in turn")
    serve_bench.add_argument("--spread", action="store_true", help="each client starts at its own sentence, the "
                             "starts spread over a second (default: all at once, in step: the worst case)")
    serve_bench.add_argument("--json", action="store_true")
    serve_bench.add_argument("--model", choices=["s5", "t5"], default="s5")
    serve_bench.add_argument("--sentences", type=Path, default=None, help="one per line (default: configs/bench_sentences.txt)")
    serve_bench.add_argument("--limit", type=int, default=6, help="sentences per client")
    serve_bench.add_argument("--url", default=None, help="measure this running server (http://HOST:PORT) instead of "
                             "starting one here; several, comma-separated: side by side, each count on each in turn")
    serve_bench.add_argument("--idle", type=int, default=0, help="hold this many more connections open, idle, "
                             "during the run")
    serve_bench.add_argument("--token", default=None, help="the bearer token that server asks for")
    serve_bench.add_argument("--threads", type=int, default=2, help="torch threads of the worker (as s5 serve)")
    serve_bench.add_argument("--plot", type=Path, default=None, help="also draw first audible and underruns against "
                             "sessions into this PNG")
    serve_bench.set_defaults(func=_bench_serve)
    paper = bench_kinds.add_parser("paper", help="the lookahead table: S5 with k = 1, 2, 3 and T5, quality (WER, "
                                   "Distill-MOS) and latency (first sound, E2E) side by side")
    paper.add_argument("--json", action="store_true")
    paper.add_argument("--sentences", type=Path, default=None, help="unseen sentences, one per line (default: "
                       "configs/eval_replies.txt)")
    paper.add_argument("--limit", type=int, default=30, help="sentences used")
    paper.add_argument("--model", action="append", default=[], help="another S5 row: NAME=FOLDER of exported weights "
                       "(repeatable)")
    add_settings_arguments(paper, "bench paper")
    paper.set_defaults(func=_bench_paper)
    voice = bench_kinds.add_parser("voice", help="spoken questions (other voices) through VAD + Whisper, answers in s5 / t5 / sentence: voice-to-voice latency")
    voice.add_argument("--json", action="store_true")
    voice.add_argument("--script", type=Path, default=None, help="replay YAML whose user lines are spoken (default: examples/bench_e2e.yaml)")
    voice.add_argument("--limit", type=int, default=None, help="questions used")
    add_settings_arguments(voice, "bench voice")
    voice.set_defaults(func=_bench_voice)
