"""The `s5` command: chat, say, replay, `data replies` and `bench e2e` here; the TTS packages register the rest
(`tts/training/cli.py`, `tts/eval/cli.py`)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tts.cli import STRETCH_HELP, VOCODER_HELP, err, notice, print_result, progress_bar
from audio_io.errors import UserError
from tts.eval import cli as eval_cli
from tts.training import cli as training_cli


def _chat(args: argparse.Namespace) -> int:
    import asyncio

    from agent.config import load_agent_settings
    from agent.logs import log_to_file
    from agent.orchestrator import AgentConfig
    from agent.session import chat, load_bundles, pick_llm
    from audio_io.sinks import WavSink, open_sink

    settings = load_agent_settings(args.config)
    log_to_file()  # a turn that fails shows one line; its traceback goes here
    mode = args.tts or settings.tts.mode
    bundles = load_bundles([mode], vocoder=args.vocoder or settings.tts.vocoder)
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
        llm = await pick_llm(args.llm or settings.llm.backend, args.ollama_model or settings.llm.ollama_model,
                             args.ollama_host or settings.llm.host, say=lambda m: err.print(f"[green]{m}[/]"),
                             openai_url=args.llm_url or settings.llm.url,
                             openai_model=args.llm_model or settings.llm.openai_model, max_tokens=settings.llm.max_tokens,
                             keep_alive=settings.llm.keep_alive)
        listener = microphone = None
        if args.voice or settings.audio.voice:
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

    from agent.config import load_agent_settings
    from agent.logs import log_to_file
    from agent.session import load_bundles, replay, soak_summary
    from llm.replay import ReplayScript

    script = ReplayScript.load(args.script)
    if args.repeat < 1:
        raise UserError(f"--repeat {args.repeat}: at least 1")
    script.turns = script.turns * args.repeat
    log_to_file()
    bundles = load_bundles([args.tts], vocoder=args.vocoder)
    out_dir = args.out or Path("replay_out") / args.script.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    with progress_bar() as progress:
        result = asyncio.run(replay(script, bundles, args.tts, out_dir, load_agent_settings().tts.synthesis(),
                                    pace=False, progress=progress, save_wavs=not args.no_wavs))
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


def _serve(args: argparse.Namespace) -> int:
    from aiohttp import web

    from agent.config import load_agent_settings
    from agent.server import ServeConfig, create_app
    from agent.session import load_bundles

    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.token:
        notice(f"serving on {args.host} without --token: anyone who can reach it can use it")
    import torch

    torch.set_num_threads(args.threads)
    llm_settings = load_agent_settings(args.config).llm  # the chat's settings, in the same order (flag first)
    bundles = load_bundles(["s5", "t5"], vocoder=args.vocoder)
    llm_factory = None
    if args.llm == "embedded":
        from llm.embedded import EmbeddedLLM

        llm_factory = EmbeddedLLM  # each conversation its own (the model is not safe to share between sessions)
    elif args.llm == "ollama":
        from llm.ollama_backend import OllamaLLM

        llm_factory = lambda: OllamaLLM(args.ollama_model or llm_settings.ollama_model,  # noqa: E731
                                        args.ollama_host or llm_settings.host, keep_alive=llm_settings.keep_alive)
    elif args.llm == "openai":
        from llm.openai_backend import OpenAILLM

        llm_factory = lambda: OpenAILLM(args.llm_model or llm_settings.openai_model or "",  # noqa: E731
                                        args.llm_url or llm_settings.url, max_tokens=llm_settings.max_tokens)
    app = create_app(bundles, ServeConfig(max_sessions=args.max_sessions, token=args.token, idle_timeout_s=args.idle_timeout,
                                          batch_decode=not args.no_batch), llm_factory)
    err.print(f"[green]s5 serve: http://{args.host}:{args.port}/health, POST /v1/audio/speech[/]")
    try:
        web.run_app(app, host=args.host, port=args.port, print=None)
    except OSError as error:  # port taken, address not ours
        raise UserError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from error
    return 0


def _bench_serve(args: argparse.Namespace) -> int:
    import asyncio

    from agent.serve_bench import bench_serve
    from agent.session import load_bundles
    from tts.eval.stream_bench import load_sentences

    try:
        counts = [int(n) for n in args.sessions.split(",") if n.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise UserError(f"--sessions {args.sessions}: comma-separated counts of at least 1, e.g. 1,2,4")
    import torch

    torch.set_num_threads(args.threads)
    sentences = load_sentences(args.sentences)[: args.limit]
    with progress_bar() as progress:
        result = asyncio.run(bench_serve(load_bundles(["s5", "t5"], vocoder=args.vocoder), sentences, counts, args.model, progress,
                                         batch_decode=not args.no_batch))
    if args.json:
        print(json.dumps(result))
    else:
        for run in result["runs"]:
            Console().print(run)
    return 0


def _bench_voice(args: argparse.Namespace) -> int:
    import asyncio

    from agent.session import DEFAULT_BENCH_SCRIPT, load_bundles
    from agent.voice_bench import bench_voice
    from llm.replay import ReplayScript

    script = ReplayScript.load(args.script or DEFAULT_BENCH_SCRIPT)
    if args.limit:
        script.turns = script.turns[: args.limit]
    bundles = load_bundles(["s5", "t5", "sentence"])
    with progress_bar() as progress:
        result = asyncio.run(bench_voice(script, bundles, progress=progress))
    print_result(result, args.json, "voice to voice")
    return 0


def _bench_e2e(args: argparse.Namespace) -> int:
    import asyncio

    from agent.session import DEFAULT_BENCH_SCRIPT, bench_e2e, load_bundles
    from llm.replay import ReplayScript

    script = ReplayScript.load(args.script or DEFAULT_BENCH_SCRIPT)
    if args.first_token_ms is not None:
        script.first_token_ms = args.first_token_ms
    if args.tokens_per_second is not None:
        script.tokens_per_second = args.tokens_per_second
    bundles = load_bundles(["s5", "t5", "sentence"], args.s5_model, args.t5_model, vocoder=args.vocoder)

    async def run(progress) -> dict:
        llm = None
        if args.llm != "replay":  # a live LLM: the chat's settings, flags first
            from agent.config import load_agent_settings
            from agent.session import pick_llm

            settings = load_agent_settings(args.config).llm
            llm = await pick_llm(args.llm, args.ollama_model or settings.ollama_model, args.ollama_host or settings.host,
                                 say=lambda m: err.print(f"[green]{m}[/]"), keep_alive=settings.keep_alive,
                                 openai_url=args.llm_url or settings.url, openai_model=args.llm_model or settings.openai_model,
                                 max_tokens=settings.max_tokens)
        try:
            return await bench_e2e(script, bundles, progress=progress, barge_in_output=args.barge_in_output, llm=llm)
        finally:
            if llm is not None:
                await llm.close()

    with progress_bar() as progress:
        result = asyncio.run(run(progress))
    if args.json:
        print(json.dumps(result))
        return 0
    table = Table(title=f"E2E latency, replayed LLM ({script.first_token_ms:.0f} ms to first token, {script.tokens_per_second:g} tokens/s)")
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


def _data_replies(args: argparse.Namespace) -> int:
    from agent.replies import write_replies

    with progress_bar() as progress:
        n = write_replies(args.out, args.count, args.seed, progress)
    err.print(f"{n} speakable reply sentences in {args.out}")
    return 0




def _pacing_note(times) -> str:
    if not times.paced_s and not times.prebuffer_ms:
        return ""
    return f", paced (+{times.paced_s:.2f} s slower, {times.prebuffer_ms:.0f} ms prebuffer: the text came slower than the voice)"


def _say(args: argparse.Namespace) -> int:
    import asyncio

    from agent.config import check_max_stretch
    from audio_io.sinks import WavSink, open_sink
    from tts.frontend.text import normalize_text
    from tts.inference.pipeline import speak
    from tts.inference.streaming import load_bundle
    from tts.inference.synthesis import SynthesisConfig

    words = normalize_text(args.text)
    if not words:
        raise UserError("nothing to say: the text has no speakable words")
    bundle = load_bundle(args.mode, args.model, vocoder=args.vocoder)
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
        sink = open_sink(args.output, bundle.codec.sample_rate, "s5_say.wav", args.device, notice=notice)
    try:
        result = asyncio.run(speak(bundle, words, args.mode, args.words_per_second, SynthesisConfig(seed=args.seed), sink,
                                   prompt=prompt, max_stretch=check_max_stretch(args.max_stretch), keep_chunks=False))
    finally:
        sink.close()
    audible = f"{result.first_audible_ms:.0f} ms" if result.first_audible_ms is not None else "never"
    where = f" -> {sink.path}" if getattr(sink, "path", None) else ""
    err.print(f"{args.mode}: {result.words} words, {result.audio_s:.2f} s of audio, first audible {audible} after the "
              f"first word, rtf {result.rtf or 0:.2f}, underruns {result.playback.underruns}{_pacing_note(result.times)}{where}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="s5", description="Streaming voice agent with S5-TTS")
    commands = parser.add_subparsers(dest="command", required=True)

    chat = commands.add_parser("chat", help="terminal voice chat (Ollama if reachable, else the embedded LLM)")
    chat.add_argument("--llm", choices=["auto", "ollama", "openai", "embedded"], default=None,
                      help="openai: an OpenAI-compatible server (vLLM, TGI, llama.cpp, LM Studio, a hosted API)")
    chat.add_argument("--llm-url", default=None, help="--llm openai: the server's base URL (default: $OPENAI_BASE_URL, "
                      "configs/agent.yaml's llm.openai_url, http://localhost:8000/v1); key from OPENAI_API_KEY")
    chat.add_argument("--llm-model", default=None, help="--llm openai: the model's name on that server")
    chat.add_argument("--tts", choices=["s5", "t5", "sentence"], default=None)
    chat.add_argument("--out", type=Path, default=None, help="write each turn as a WAV (and latency.jsonl) here instead of playing")
    chat.add_argument("--ollama-model", default=None)
    chat.add_argument("--ollama-host", default=None)
    chat.add_argument("--config", type=Path, default=None, help="agent YAML (default: configs/agent.yaml)")
    chat.add_argument("--vocoder", default=None, help=VOCODER_HELP + " (default: configs/agent.yaml's tts.vocoder)")
    chat.add_argument("--voice", action="store_true", help="also listen to the microphone (VAD + Whisper); typing still works")
    chat.set_defaults(func=_chat)

    rep = commands.add_parser("replay", help="run a YAML conversation script: one WAV per turn and latency records")
    rep.add_argument("script", type=Path)
    rep.add_argument("--tts", choices=["s5", "t5", "sentence"], default="s5")
    rep.add_argument("--out", type=Path, default=None, help="default: replay_out/SCRIPT")
    rep.add_argument("--json", action="store_true")
    rep.add_argument("--vocoder", default=None, help=VOCODER_HELP)
    rep.add_argument("--repeat", type=int, default=1, help="play the script this many times (a soak: latency drift and "
                     "memory growth after warm-up are reported)")
    rep.add_argument("--no-wavs", action="store_true", help="keep the records only")
    rep.set_defaults(func=_replay)

    serve = commands.add_parser("serve", help="streaming speech server: GET /health, POST /v1/audio/speech (OpenAI-style)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (use it off localhost)")
    serve.add_argument("--max-sessions", type=int, default=4, help="requests and conversations at once; more get a 503")
    serve.add_argument("--idle-timeout", type=float, default=300.0, help="seconds a silent conversation stays open")
    serve.add_argument("--vocoder", default=None, help=VOCODER_HELP + " (a request may ask for another)")
    serve.add_argument("--no-batch", action="store_true",
                       help="each session steps its own decoder (default: all sessions' steps in one batched pass)")
    serve.add_argument("--llm", choices=["embedded", "ollama", "openai", "none"], default="embedded",
                       help="the LLM of /ws conversations (none: speech endpoint only)")
    serve.add_argument("--ollama-model", default=None)
    serve.add_argument("--ollama-host", default=None)
    serve.add_argument("--llm-url", default=None, help="--llm openai: the server's base URL")
    serve.add_argument("--llm-model", default=None, help="--llm openai: the model's name on that server")
    serve.add_argument("--config", type=Path, default=None, help="agent YAML for the LLM settings (default: configs/agent.yaml)")
    serve.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1: concurrent sessions then share the cores instead of oversubscribing them; measured with 2 sessions on 2 cores: 0 underruns at 1 thread, 2 at 2)")
    serve.set_defaults(func=_serve)

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
    say.add_argument("--mode", choices=["s5", "t5", "sentence"], default="s5")
    say.add_argument("--out", type=Path, default=None, help="write a WAV instead of playing")
    say.add_argument("--words-per-second", type=float, default=0.0, help="feed words at this rate (0: all at once)")
    say.add_argument("--model", type=Path, default=None, help="exported model folder (default: the shipped one)")
    say.add_argument("--output", choices=["auto", "device", "wav", "null"], default="auto")
    say.add_argument("--device", default=None, help="sounddevice output device name or index")
    say.add_argument("--seed", type=int, default=None)
    say.add_argument("--prompt-wav", type=Path, default=None, help="reference clip of the voice to speak in (zero-shot)")
    say.add_argument("--prompt-text", default=None, help="transcript of --prompt-wav")
    say.add_argument("--max-stretch", type=float, default=None, help=STRETCH_HELP)
    say.add_argument("--vocoder", default=None, help=VOCODER_HELP)
    say.set_defaults(func=_say)

    bench = commands.add_parser("bench", help="benchmarks")
    bench_kinds = bench.add_subparsers(dest="kind", required=True)
    eval_cli.register(commands, bench_kinds)
    e2e = bench_kinds.add_parser("e2e", help="S5 vs T5 vs sentence mode on one replayed LLM stream (the paper's Table 4)")
    e2e.add_argument("--json", action="store_true")
    e2e.add_argument("--script", type=Path, default=None, help="replay YAML (default: examples/bench_e2e.yaml)")
    e2e.add_argument("--first-token-ms", type=float, default=None)
    e2e.add_argument("--tokens-per-second", type=float, default=None)
    e2e.add_argument("--vocoder", default=None, help=VOCODER_HELP)
    e2e.add_argument("--llm", choices=["replay", "ollama", "openai", "embedded"], default="replay",
                     help="replay: the script's answers at a fixed pace (default, comparable run to run); otherwise a live "
                     "LLM answers the script's user lines")
    e2e.add_argument("--llm-url", default=None, help="--llm openai: the server's base URL")
    e2e.add_argument("--llm-model", default=None, help="--llm openai: the model's name on that server")
    e2e.add_argument("--ollama-model", default=None)
    e2e.add_argument("--ollama-host", default=None)
    e2e.add_argument("--config", type=Path, default=None, help="agent YAML for a live LLM's settings (default: configs/agent.yaml)")
    e2e.add_argument("--s5-model", type=Path, default=None)
    e2e.add_argument("--t5-model", type=Path, default=None)
    e2e.add_argument("--barge-in-output", choices=["null", "device"], default="null",
                     help="time barge-in on the simulated player (default) or through the sound card")
    e2e.set_defaults(func=_bench_e2e)
    serve_bench = bench_kinds.add_parser("serve", help="s5 serve under 1, 2, 4 ... concurrent clients: first audible, underruns, rtf")
    serve_bench.add_argument("--sessions", default="1,2,4,8")
    serve_bench.add_argument("--vocoder", default=None, help=VOCODER_HELP)
    serve_bench.add_argument("--no-batch", action="store_true", help="each session steps its own decoder (the comparison)")
    serve_bench.add_argument("--json", action="store_true")
    serve_bench.add_argument("--model", choices=["s5", "t5"], default="s5")
    serve_bench.add_argument("--sentences", type=Path, default=None, help="one per line (default: configs/bench_sentences.txt)")
    serve_bench.add_argument("--limit", type=int, default=6, help="sentences per client")
    serve_bench.add_argument("--threads", type=int, default=1, help="torch threads (as s5 serve)")
    serve_bench.set_defaults(func=_bench_serve)
    voice = bench_kinds.add_parser("voice", help="spoken questions (other voices) through VAD + Whisper, answers in s5 / t5 / sentence: voice-to-voice latency")
    voice.add_argument("--json", action="store_true")
    voice.add_argument("--script", type=Path, default=None, help="replay YAML whose user lines are spoken (default: examples/bench_e2e.yaml)")
    voice.add_argument("--limit", type=int, default=None, help="questions used")
    voice.set_defaults(func=_bench_voice)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
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
