"""The `s5` command: chat, say, replay, `data replies` and `bench e2e` here; the TTS packages register the rest
(`tts/training/cli.py`, `tts/eval/cli.py`)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from agent.bench import cli as bench_cli
from agent.serve import cli as serve_cli
from agent.settings import SettingsShown, add_settings_arguments, settings_for
from audio_io.errors import UserError
from tts.cli import err, notice, progress_bar
from tts.eval import cli as eval_cli
from tts.training import cli as training_cli


def _chat(args: argparse.Namespace) -> int:
    import asyncio

    from agent.chat import chat, load_bundles, open_llm
    from agent.logs import log_to_file
    from agent.orchestrator import AgentConfig
    from audio_io.sinks import WavSink, open_sink

    settings = settings_for("chat", args)
    log_to_file()  # a turn that fails shows one line; its traceback goes here
    mode = settings.tts.mode
    bundles = load_bundles([mode], vocoder=settings.tts.vocoder)
    rate = bundles[mode].codec.sample_rate
    out_dir = args.out
    output = "wav" if out_dir else settings.audio.output
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    sink = open_sink(output, rate, (out_dir or Path(".")) / "s5_chat.wav", settings.audio.device,
                     notice=notice)
    if isinstance(sink, WavSink) and out_dir is None:
        out_dir = Path("s5_chat_out")
        out_dir.mkdir(exist_ok=True)
        err.print(f"[yellow]turns are written to {out_dir}/turn_NNN.wav[/]")
    config = AgentConfig.from_settings(settings, mode, (out_dir or Path("s5_chat_out")) / "latency.jsonl")  # a record per turn
    console = Console()

    async def run() -> int:
        llm = await open_llm(settings.llm, say=lambda m: err.print(f"[green]{m}[/]"))
        listener = microphone = None
        if settings.audio.voice:
            from agent.listen import Listener
            from audio_io.capture import Microphone
            from audio_io.echo import EchoGate
            from audio_io.sinks import AudioDeviceError
            from audio_io.vad import VadConfig

            try:
                await Listener.warm_up()
                microphone = Microphone(settings.audio.input_device)
                audio = settings.audio
                echo = EchoGate(sink.levels, audio.echo_coupling_db, audio.echo_margin_db) if audio.barge_in else None
                listener = Listener(microphone, VadConfig(end_silence_ms=audio.end_silence_ms), echo)
                err.print("[green]listening: speak, or type[/]")
            except AudioDeviceError as error:  # no microphone: one line, and typing still works
                notice(f"{error}; type instead")
        try:
            return await chat(llm, bundles, sink, config, console, out_dir, listener)
        finally:
            if microphone is not None:
                microphone.close()
            await llm.close()

    try:
        return asyncio.run(run())
    finally:
        sink.close()


def _replay(args: argparse.Namespace) -> int:
    import asyncio

    from agent.chat import live_llm, load_bundles
    from agent.logs import log_to_file
    from agent.orchestrator import AgentConfig
    from agent.replay import replay, soak_summary
    from llm.replay import ReplayScript

    settings = settings_for("replay", args)
    if args.repeat < 1:
        raise UserError(f"--repeat {args.repeat}: at least 1")
    if args.ray is not None or len(args.scripts) > 1:
        return _replay_many(args, settings)
    script = ReplayScript.load(args.scripts[0])
    script.turns = script.turns * args.repeat
    log_to_file()
    mode = settings.tts.mode
    bundles = load_bundles([mode], vocoder=settings.tts.vocoder)
    out_dir = args.out or Path("replay_out") / args.scripts[0].stem
    out_dir.mkdir(parents=True, exist_ok=True)

    async def run(progress):
        async with live_llm(settings.llm, say=lambda m: err.print(f"[green]{m}[/]")) as llm:
            return await replay(script, bundles, AgentConfig.from_settings(settings, mode), out_dir, pace=False,
                                progress=progress, save_wavs=not args.no_wavs, llm=llm)

    with progress_bar() as progress:
        result = asyncio.run(run(progress))
    soak = soak_summary(result) if args.repeat > 1 else None
    if args.json:
        print(json.dumps({"script": result.script, "mode": result.mode, "wavs": [str(w) for w in result.wavs],
                          "records": [r.to_json() for r in result.records], **({"soak": soak} if soak else {})}))
    else:
        for record in result.records:
            Console(soft_wrap=True).print(record.summary_line(), markup=False, highlight=False)
        if soak:
            Console(soft_wrap=True).print(f"soak: {json.dumps(soak)}", markup=False, highlight=False)
        err.print(f"{len(result.wavs)} WAVs and latency.jsonl in {out_dir}")
    return 0


def _replay_many(args: argparse.Namespace, settings) -> int:
    """Several scripts (or any with --ray): one latency.jsonl of every turn, each with its script's name, and one
    summary table; a script that fails is named and the others still play."""
    from rich.table import Table

    from agent.replay import ScriptOutcome, outcome_rows, play_on_ray, play_scripts, write_outcomes
    from llm.base import LLMError
    from llm.replay import ReplayScript

    if args.scripts_per_task < 1:
        raise UserError(f"--scripts-per-task {args.scripts_per_task}: at least 1")
    scripts, unreadable = [], []
    for path in args.scripts:
        try:
            script = ReplayScript.load(path)
        except LLMError as error:  # named in the table; the others still play
            unreadable.append(ScriptOutcome(path.stem, [], str(error)))
            continue
        script.turns = script.turns * args.repeat
        script.name = path.stem if script.name in {s.name for s in scripts} | {""} else script.name
        scripts.append(script)
    out_dir = args.out or Path("replay_out") / "many"
    if args.ray is not None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UserError("--ray needs Ray: pip install 's5-agent[cluster]'") from None
        outcomes = play_on_ray(scripts, settings, args.ray, args.scripts_per_task) if scripts else []
    else:
        outcomes = play_scripts(scripts, settings, out_dir, save_wavs=not args.no_wavs) if scripts else []
    outcomes += unreadable
    write_outcomes(outcomes, out_dir / "latency.jsonl")
    rows = outcome_rows(outcomes)
    if args.json:
        print(json.dumps({"scripts": rows, "latency": str(out_dir / "latency.jsonl")}))
    else:
        table = Table("script", "turns", "E2E p50 ms", "E2E p95 ms", "underruns", "errors", "failed")
        for row in rows:
            table.add_row(*(str(row[k]) if row[k] is not None else "" for k in
                            ("script", "turns", "e2e_p50_ms", "e2e_p95_ms", "underruns", "errors", "failed")))
        Console(soft_wrap=True).print(table)
        err.print(f"every turn's record in {out_dir / 'latency.jsonl'}")
    return 1 if any(o.error for o in outcomes) else 0


def _wyoming(args: argparse.Namespace) -> int:
    import asyncio

    import torch

    try:
        from agent.integrations.wyoming import serve_wyoming
    except ImportError as error:
        raise UserError("s5 wyoming needs the wyoming package: pip install 's5-agent[wyoming]'") from error
    from tts.inference.batching import StreamWorker, render_threads_for
    from tts.inference.streaming import load_bundle

    settings = settings_for("wyoming", args)
    if not args.uri.startswith(("tcp://", "unix://")):
        raise UserError(f"--uri {args.uri}: tcp://HOST:PORT or unix://PATH")
    torch.set_num_threads(1)  # every connection's synthesis runs on the worker's threads
    bundle = load_bundle("s5", vocoder=settings.tts.vocoder, render_threads=render_threads_for(args.threads))
    err.print(f"[green]s5 wyoming: {args.uri} (Home Assistant: add the Wyoming integration with this host and port)[/]")
    try:
        asyncio.run(serve_wyoming(args.uri, bundle, settings.tts.synthesis(), StreamWorker(args.threads)))
    except OSError as error:
        raise UserError(f"cannot listen on {args.uri}: {error.strerror or error}") from error
    return 0


def _data_replies(args: argparse.Namespace) -> int:
    from llm.embedded import EmbeddedLLM
    from tts.data.replies import write_replies

    llm = EmbeddedLLM(seed=args.seed, max_tokens=60)
    with progress_bar() as progress:
        n = write_replies(args.out, llm.complete, args.count, args.seed, progress)
    err.print(f"{n} speakable reply sentences in {args.out}")
    return 0


def _pacing_note(times) -> str:
    if not times.paced_s and not times.prebuffer_ms:
        return ""
    return f", paced (+{times.paced_s:.2f} s slower, {times.prebuffer_ms:.0f} ms prebuffer: the text came slower than the voice)"


def _say(args: argparse.Namespace) -> int:
    import asyncio

    from audio_io.sinks import WavSink, open_sink
    from tts.frontend.text import normalize_text
    from tts.inference.pipeline import speak
    from tts.inference.streaming import load_bundle
    from dataclasses import replace

    from agent.chat import warn_of_a_named_vocoder

    settings = settings_for("say", args)
    mode = settings.tts.mode
    words = normalize_text(args.text)
    if not words:
        raise UserError("nothing to say: the text has no speakable words")
    bundle = load_bundle(mode, args.model, vocoder=settings.tts.vocoder)
    warn_of_a_named_vocoder(bundle)
    prompt = None
    if args.prompt_wav:
        from audio_io.wav import read_wav, resample
        from tts.data.voices import SAMPLE_RATE
        from tts.inference.synthesis import VoicePrompt

        if not args.prompt_text:
            raise UserError("--prompt-wav needs --prompt-text (what the clip says)")
        audio, rate = read_wav(args.prompt_wav)
        prompt = VoicePrompt.from_audio(bundle, args.prompt_text, resample(audio, rate, SAMPLE_RATE))
    if args.out:
        sink = WavSink(bundle.codec.sample_rate, args.out, pace=False)
    else:
        sink = open_sink(settings.audio.output, bundle.codec.sample_rate, "s5_say.wav", settings.audio.device,
                         notice=notice)
    units: list = []
    config = replace(settings.tts.synthesis(), seed=args.seed, trace_attention=bool(args.plot))
    try:
        result = asyncio.run(speak(bundle, words, mode, args.words_per_second, config, sink, prompt=prompt,
                                   max_stretch=settings.tts.max_stretch, keep_chunks=bool(args.plot),
                                   traced_units=units, emit_every=settings.tts.emit_every))
    finally:
        sink.close()
    if args.plot:
        from agent.bench.plots import plot_attention
        from tts.inference.pipeline import join_chunks

        picture = plot_attention(units, join_chunks(result.chunks), bundle.codec.sample_rate, args.plot,
                                 bundle.model.config.lookahead_words)
        err.print(f"[green]picture: {picture}[/]")
    if args.captions:
        from agent.captions import write_captions

        err.print(f"[green]captions: {write_captions(result.times.word_times, args.captions)}[/]")
    audible = f"{result.first_audible_ms:.0f} ms" if result.first_audible_ms is not None else "never"
    where = f" -> {sink.path}" if getattr(sink, "path", None) else ""
    if args.json:
        print(json.dumps({"mode": mode, "words": [w.to_json() for w in result.times.word_times],
                          "audio_s": round(result.audio_s, 3), "first_audible_ms": result.first_audible_ms,
                          "rtf": result.rtf, "underruns": result.playback.underruns,
                          "wav": str(sink.path) if getattr(sink, "path", None) else None}))
    err.print(f"{mode}: {result.words} words, {result.audio_s:.2f} s of audio, first audible {audible} after the "
              f"first word, rtf {result.rtf or 0:.2f}, underruns {result.playback.underruns}{_pacing_note(result.times)}{where}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="s5", description="Streaming voice agent with S5-TTS")
    commands = parser.add_subparsers(dest="command", required=True)

    chat = commands.add_parser("chat", help="terminal voice chat (Ollama if reachable, else the embedded LLM)")
    add_settings_arguments(chat, "chat")
    chat.add_argument("--out", type=Path, default=None, help="write each turn as a WAV (and latency.jsonl) here instead of playing")
    chat.set_defaults(func=_chat)

    rep = commands.add_parser("replay", help="run a YAML conversation script: one WAV per turn and latency records")
    rep.add_argument("scripts", type=Path, nargs="+", metavar="SCRIPT")
    add_settings_arguments(rep, "replay")
    rep.add_argument("--out", type=Path, default=None, help="default: replay_out/SCRIPT")
    rep.add_argument("--json", action="store_true")
    rep.add_argument("--repeat", type=int, default=1, help="play the script this many times (a soak: latency drift and "
                     "memory growth after warm-up are reported)")
    rep.add_argument("--no-wavs", action="store_true", help="keep the records only")
    rep.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                     help="play the scripts as Ray tasks on the cluster at ADDRESS (auto: the running one; none: a "
                     "local one); records only, gathered here")
    rep.add_argument("--scripts-per-task", type=int, default=4, help="with --ray: scripts a task plays (it loads "
                     "the voices once)")
    rep.set_defaults(func=_replay)

    serve_cli.register(commands)
    wyoming = commands.add_parser("wyoming", help="a Wyoming TTS server for Home Assistant (streams an LLM's reply "
                                  "word by word)")
    wyoming.add_argument("--uri", default="tcp://127.0.0.1:10200", help="tcp://HOST:PORT or unix://PATH")
    wyoming.add_argument("--threads", type=int, default=2, help="torch threads of the worker every connection shares")
    add_settings_arguments(wyoming, "wyoming")
    wyoming.set_defaults(func=_wyoming)

    data = commands.add_parser("data", help="offline speech data")
    data_kinds = data.add_subparsers(dest="kind_", required=True)
    training_cli.register(commands, data_kinds)
    replies = data_kinds.add_parser("replies", help="conversational replies by the embedded LLM, as corpus text")
    replies.add_argument("--out", type=Path, default=Path("configs/llm_replies.txt"))
    replies.add_argument("--count", type=int, default=400, help="questions asked")
    replies.add_argument("--seed", type=int, default=0)
    replies.set_defaults(func=_data_replies)
    say = commands.add_parser("say", help="speak a text through the streaming engine (plays, or writes a WAV)")
    say.add_argument("text")
    add_settings_arguments(say, "say")
    say.add_argument("--out", type=Path, default=None, help="write a WAV instead of playing")
    say.add_argument("--words-per-second", type=float, default=0.0, help="feed words at this rate (0: all at once)")
    say.add_argument("--model", type=Path, default=None, help="exported model folder (default: the shipped one)")
    say.add_argument("--seed", type=int, default=None)
    say.add_argument("--prompt-wav", type=Path, default=None, help="reference clip of the voice to speak in (zero-shot)")
    say.add_argument("--prompt-text", default=None, help="transcript of --prompt-wav")
    say.add_argument("--json", action="store_true", help="print one JSON object: each word's start and end in the "
                     "audio (seconds), and the figures")
    say.add_argument("--captions", type=Path, default=None, help="write the word times as captions (.srt or .vtt)")
    say.add_argument("--plot", type=Path, default=None, help="also draw the cross-attention (lookahead window marked) and "
                     "the waveform into this PNG")
    say.set_defaults(func=_say)

    bench = commands.add_parser("bench", help="benchmarks")
    bench_kinds = bench.add_subparsers(dest="kind", required=True)
    eval_cli.register(commands, bench_kinds)
    _settled(commands.choices["eval"], "eval", {"mode": "tts.mode", "vocoder": "tts.vocoder",
                                                 "cfg_scale": "tts.cfg_scale"})
    _settled(bench_kinds.choices["words"], "bench words", {"mode": "tts.mode", "vocoder": "tts.vocoder"})
    _settled(bench_kinds.choices["tts"], "bench tts", {"vocoder": "tts.vocoder", "emit_every": "tts.emit_every",
                                                        "max_stretch": "tts.max_stretch"})
    bench_cli.register(bench_kinds)
    return parser


def _settled(parser: argparse.ArgumentParser, command: str, fields: dict[str, str]) -> None:
    """A command of the TTS packages (which cannot import the agent) under the settings path: its settings flags
    added here, and the resolved values handed to it as `args.<name>` (`fields`: name -> key)."""
    from agent.settings import get_setting

    add_settings_arguments(parser, command)
    run = parser.get_default("func")

    def with_settings(args: argparse.Namespace) -> int:
        settings = settings_for(command, args)
        for name, key in fields.items():
            setattr(args, name, get_setting(settings, key))
        return run(args)

    parser.set_defaults(func=with_settings)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SettingsShown:
        return 0
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except UserError as error:  # what the user can fix: one line; anything else is a bug and keeps its traceback
        err.print(f"[red]error:[/] {escape(str(error))}", highlight=False)
        return 2
    except OSError as error:
        if error.filename is None:  # not a file the user named
            raise
        err.print(f"[red]error:[/] {error.strerror}: {error.filename}", highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
