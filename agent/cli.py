"""The `s5` command."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

err = Console(stderr=True, soft_wrap=True)  # one error, one line, whatever the terminal width


def _bench_model(args: argparse.Namespace) -> int:
    from tts.eval.model_bench import ModelBenchConfig, run_model_bench

    bench = ModelBenchConfig(config=args.config, decode_frames=args.frames)
    with Progress(console=err, transient=True) as progress:
        result = run_model_bench(bench, progress)
    _print_result(result, args.json, "S5-TTS model benchmark")
    return 0


def _agent_config(settings, mode: str, records_path: Path | None):
    from agent.orchestrator import AgentConfig

    return AgentConfig(tts_mode=mode, system_prompt=settings.system_prompt, history_turns=settings.history_turns,
                       emit_every=settings.tts.emit_every, synthesis=settings.tts.synthesis(),
                       max_stretch=settings.tts.max_stretch, records_path=records_path)


def _chat(args: argparse.Namespace) -> int:
    import asyncio

    from agent.config import load_agent_settings
    from agent.session import chat, load_bundles, pick_llm
    from audio_io.sinks import WavSink, open_sink

    settings = load_agent_settings(args.config)
    mode = args.tts or settings.tts.mode
    bundles = load_bundles([mode])
    rate = bundles[mode].codec.sample_rate
    out_dir = args.out
    output = "wav" if out_dir else settings.audio.output
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    sink = open_sink(output, rate, (out_dir or Path(".")) / "s5_chat.wav", settings.audio.device,
                     notice=lambda m: err.print(f"[yellow]{m}[/]"))
    if isinstance(sink, WavSink) and out_dir is None:
        out_dir = Path("s5_chat_out")
        out_dir.mkdir(exist_ok=True)
        err.print(f"[yellow]turns are written to {out_dir}/turn_NNN.wav[/]")
    config = _agent_config(settings, mode, (out_dir or Path("s5_chat_out")) / "latency.jsonl")  # one record per turn
    console = Console()

    async def run() -> int:
        llm = await pick_llm(args.llm or settings.llm.backend, args.ollama_model or settings.llm.ollama_model,
                             args.ollama_host or settings.llm.host, say=lambda m: err.print(f"[green]{m}[/]"),
                             keep_alive=settings.llm.keep_alive)
        try:
            return await chat(llm, bundles, sink, config, console, out_dir)
        finally:
            await llm.close()

    try:
        return asyncio.run(run())
    finally:
        sink.close()


def _replay(args: argparse.Namespace) -> int:
    import asyncio

    from agent.config import load_agent_settings
    from agent.session import load_bundles, replay
    from llm.replay import ReplayScript

    script = ReplayScript.load(args.script)
    bundles = load_bundles([args.tts])
    out_dir = args.out or Path("replay_out") / args.script.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    with _progress() as progress:
        result = asyncio.run(replay(script, bundles, args.tts, out_dir, load_agent_settings().tts.synthesis(),
                                    pace=False, progress=progress))
    if args.json:
        print(json.dumps({"script": result.script, "mode": result.mode, "wavs": [str(w) for w in result.wavs],
                          "records": [r.to_json() for r in result.records]}))
    else:
        for record in result.records:
            Console(soft_wrap=True).print(record.summary_line(), markup=False, highlight=False)
        err.print(f"{len(result.wavs)} WAVs and latency.jsonl in {out_dir}")
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
    bundles = load_bundles(["s5", "t5", "sentence"], args.s5_model, args.t5_model)
    with _progress() as progress:
        result = asyncio.run(bench_e2e(script, bundles, progress=progress))
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
    return 0


def _data_build(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

    from tts.data.corpus import CorpusConfig, build_corpus

    if args.text and not args.text.exists():
        raise FileNotFoundError(f"no text file {args.text}")
    config = CorpusConfig(hours=args.hours, seed=args.seed, workers=args.workers, text_file=str(args.text or ""))
    if args.voices:
        config.voices = args.voices.split(",")
        config.held_out = [v for v in config.held_out if v in config.voices]
    columns = (TextColumn("{task.description:>18}"), BarColumn(), TextColumn("{task.completed:>7.0f}/{task.total:.0f} s"), TimeRemainingColumn())
    with Progress(*columns, console=err) as progress:
        counts = build_corpus(config, args.out, progress)
    err.print(f"corpus in {args.out}: " + ", ".join(f"{name} {n}" for name, n in counts.items()))
    return 0


def _data_replies(args: argparse.Namespace) -> int:
    from agent.replies import write_replies

    with _progress() as progress:
        n = write_replies(args.out, args.count, args.seed, progress)
    err.print(f"{n} speakable reply sentences in {args.out}")
    return 0


def _data_import(args: argparse.Namespace) -> int:
    from tts.data.corpus import import_corpus

    counts = import_corpus(args.kind, args.root, args.out)
    err.print(f"manifests in {args.out}: " + ", ".join(f"{name} {n}" for name, n in counts.items()))
    return 0


def _read_sentences(path: Path) -> list[str]:
    """One sentence per line; blank lines and '#' comments skipped."""
    sentences = [l.strip() for l in path.read_text().splitlines() if l.strip() and not l.lstrip().startswith("#")]
    if not sentences:
        raise ValueError(f"no sentences in {path}")
    return sentences


def _progress() -> Progress:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description:>22}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err)


def _codec_features(args: argparse.Namespace) -> int:
    from tts.training.codec_train import extract_features

    with _progress() as progress:
        speakers = args.speakers.split(",") if args.speakers else None
        manifests = tuple(args.manifests.split(","))
        n = extract_features(args.corpus, args.workers, progress, manifests, speakers, args.per_speaker)
    err.print(f"WORLD features for {n} utterances in {args.corpus / 'features'}")
    return 0


def _codec_train(args: argparse.Namespace) -> int:
    if args.kind == "mel":
        return _mel_codec_train(args)
    from dataclasses import replace

    from tts.codec.world_codec import DEFAULT_CODEC_DIR, BuiltinCodec, CodecConfig
    from tts.training.codec_train import CodecTrainConfig, extract_features, train_codec

    init = BuiltinCodec.load(args.init_from) if args.init_from else None
    if args.decoder_only and init is None:
        raise ValueError("--decoder-only retrains the decoder of an existing codec: give it with --init-from")
    given = {name: value for name, value in (("decoder_channels", args.decoder_channels), ("low_order_boost",
             args.low_order_boost), ("spectrum_weighting", args.spectrum_weighting)) if value is not None}
    if init is not None:
        codec_config = replace(init.config, **given)
    else:
        frames_per_code = {86: 1, 43: 2, 21: 4, 22: 4}[round(args.frame_rate)]
        codec_config = CodecConfig(frames_per_code=frames_per_code, **given)
    with _progress() as progress:
        extract_features(args.corpus, args.workers, progress, manifests=("train",), per_speaker=args.per_speaker)
        extract_features(args.corpus, args.workers, progress, manifests=("val",))
        out = args.out or DEFAULT_CODEC_DIR
        out.mkdir(parents=True, exist_ok=True)
        train_config = CodecTrainConfig(minutes=args.minutes, max_hours=args.max_hours, decoder_only=args.decoder_only,
                                        delta_weight=args.delta_weight, lr=args.lr or 2e-3)
        codec, log = train_codec(args.corpus, codec_config, train_config, progress, out / "train_log.jsonl", init)
    codec.save(out)
    err.print(f"codec ({codec.frame_rate:.2f} frames/s) saved to {out}; validation: {log}")
    return 0


def _codec_vocoder(args: argparse.Namespace) -> int:
    import torch

    from tts.codec.load import load_codec
    from tts.codec.mel_codec import MelCodec
    from tts.training.vocoder_train import VocoderDistillConfig, distill_vocoder

    if args.threads:
        torch.set_num_threads(args.threads)
    codec = load_codec(args.codec)
    if not isinstance(codec, MelCodec):
        raise ValueError(f"{args.codec} is not a mel codec: the vocoder learns from a mel codec's decoded log-mel")
    config = VocoderDistillConfig(resblock_kernel_sizes=[int(k) for k in args.kernels.split(",")], minutes=args.minutes,
                                  batch=args.batch, lr=args.lr, utterances=args.utterances, init_from=args.init_from or "")
    with _progress() as progress:
        log = distill_vocoder(args.corpus, codec, args.out, config, progress)
    err.print(f"vocoder saved to {args.out}: {log['steps']} steps in {log['minutes']} minutes")
    return 0


def _mel_codec_train(args: argparse.Namespace) -> int:
    from tts.codec.mel_codec import MelCodecConfig
    from tts.training.mel_codec_train import MelCodecTrainConfig, train_mel_codec

    stack = {86: 1, 43: 2, 21: 4, 22: 4}.get(round(args.frame_rate))
    if stack is None:
        raise ValueError(f"--frame-rate {args.frame_rate}: the mel codec runs at 86, 43 or 21.5 frames/s")
    if args.out is None:
        raise ValueError("--out is required for the mel codec (the shipped one is tts/assets/mel_codec)")
    speakers = args.speakers.split(",") if args.speakers else None
    train_config = MelCodecTrainConfig(minutes=args.minutes, max_hours=args.max_hours, speakers=speakers,
                                       **({"lr": args.lr} if args.lr is not None else {}))
    args.out.mkdir(parents=True, exist_ok=True)
    with _progress() as progress:
        codec, log = train_mel_codec(args.corpus, MelCodecConfig(stack=stack), train_config, progress,
                                     args.out / "train_log.jsonl", checkpoint=args.out)
    err.print(f"mel codec ({codec.frame_rate:.2f} frames/s) saved to {args.out}; validation: {log}")
    return 0


def _data_codes(args: argparse.Namespace) -> int:
    from tts.codec.load import load_codec
    from tts.data.tokens import record_codec, tokenize_manifest
    from tts.frontend.g2p import G2P

    codec = load_codec(args.codec)
    record_codec(args.out, str(args.codec or ""))
    g2p = G2P()
    with _progress() as progress:
        for manifest in args.manifests.split(","):
            if (args.corpus / f"{manifest}.jsonl").exists():
                speakers = args.speakers.split(",") if args.speakers else None
                tokenize_manifest(args.corpus, manifest, codec, args.out, g2p, progress, speakers)
    err.print(f"codec tokens in {args.out}")
    return 0


def _bench_codec(args: argparse.Namespace) -> int:
    from tts.codec.load import load_codec
    from tts.eval.codec_bench import (
        corpus_summary,
        manifest_clips,
        run_codec_bench,
        voice_clips,
    )

    codec = load_codec(args.codec)
    if args.vocoder:
        if not hasattr(codec, "use_vocoder"):
            raise ValueError("--vocoder goes with a mel codec: add --codec tts/assets/mel_codec (the default codec is the WORLD one)")
        codec.use_vocoder(args.vocoder)
    speaker = None if args.speaker == "all" else args.speaker
    if args.sentences:
        clips = voice_clips(_read_sentences(args.sentences)[: args.limit], speaker or "piper_joe")
        source = {"sentences": str(args.sentences)}
    else:
        if not args.manifest.exists():
            raise FileNotFoundError(f"no manifest {args.manifest} (build a corpus with `s5 data build`, or pass --sentences FILE)")
        clips = manifest_clips(args.manifest, args.limit, speaker)
        voices, hours = corpus_summary(args.manifest.parent)
        source = {"manifest": str(args.manifest), "voices": voices, "hours": round(hours, 2)}
    with _progress() as progress:
        result = run_codec_bench(codec, clips, progress, quality=not args.no_quality)
    vocoder = {"vocoder": codec.config.vocoder} if hasattr(codec, "use_vocoder") else {}
    _print_result({**result, **source, **vocoder, "speaker": speaker or "all"}, args.json, "codec round trip")
    return 0


def _train(args: argparse.Namespace) -> int:
    from tts.training.trainer import load_train_config, train

    model_config, config = load_train_config(args.config)
    for name in ("data", "out"):
        if getattr(args, name):
            setattr(config, name, str(getattr(args, name)))
    if args.max_minutes is not None:
        config.max_minutes = args.max_minutes
    if args.max_steps is not None:
        config.max_steps = args.max_steps
    if args.speakers:
        config.speakers = args.speakers.split(",")
    if args.threads:
        config.threads = args.threads
    if args.init_from:
        config.init_from = str(args.init_from)
    elif args.restart_schedule:
        raise ValueError("--restart-schedule goes with --init-from")
    if args.codec:
        config.codec_dir = str(args.codec)
    config.restart_schedule = args.restart_schedule
    with _progress() as progress:
        step = train(model_config, config, progress)
    err.print(f"trained to step {step}; checkpoint and export in {config.out}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from tts.eval.evaluate import evaluate, heldout_sentences
    from tts.inference.streaming import load_bundle

    bundle = load_bundle(args.mode, args.model, args.codec)
    if args.sentences:
        sentences = _read_sentences(args.sentences)[: args.limit]
    else:
        sentences = heldout_sentences(args.corpus, limit=args.limit)
    prompt = clip = None
    if args.zero_shot:
        from tts.eval.evaluate import zero_shot_prompt

        prompt, clip = zero_shot_prompt(bundle)
    with _progress() as progress:
        result = evaluate(bundle, sentences, args.reference_voice, out_dir=args.out, progress=progress, prompt=prompt, speaker_clip=clip)
    result["zero_shot"] = bool(args.zero_shot)
    _print_result(result, args.json, "S5-TTS evaluation")
    return 0


STRETCH_HELP = "s5 pacing: slow speech down at most this much while waiting for slower text (default 1.3; 1: off)"


def _pacing_note(times) -> str:
    if not times.paced_s and not times.prebuffer_ms:
        return ""
    return f", paced (+{times.paced_s:.2f} s slower, {times.prebuffer_ms:.0f} ms prebuffer: the text came slower than the voice)"


def _say(args: argparse.Namespace) -> int:
    import asyncio

    from agent.config import check_max_stretch
    from agent.say import say
    from audio_io.sinks import WavSink, open_sink
    from tts.frontend.text import normalize_text
    from tts.inference.streaming import load_bundle
    from tts.inference.synthesis import SynthesisConfig

    words = normalize_text(args.text)
    if not words:
        raise ValueError("nothing to say: the text has no speakable words")
    bundle = load_bundle(args.mode, args.model)
    prompt = None
    if args.prompt_wav:
        from audio_io.wav import read_wav, resample
        from tts.data.voices import SAMPLE_RATE
        from tts.inference.synthesis import VoicePrompt

        if not args.prompt_text:
            raise ValueError("--prompt-wav needs --prompt-text (what the clip says)")
        audio, rate = read_wav(args.prompt_wav)
        prompt = VoicePrompt.from_audio(bundle, args.prompt_text, resample(audio, rate, SAMPLE_RATE))
    if args.out:
        sink = WavSink(bundle.codec.sample_rate, args.out, pace=False)
    else:
        sink = open_sink(args.output, bundle.codec.sample_rate, "s5_say.wav", args.device, notice=lambda m: err.print(f"[yellow]{m}[/]"))
    try:
        result = asyncio.run(say(bundle, words, sink, args.mode, args.words_per_second, SynthesisConfig(seed=args.seed), prompt,
                                 check_max_stretch(args.max_stretch)))
    finally:
        sink.close()
    audible = f"{result.first_audible_ms:.0f} ms" if result.first_audible_ms is not None else "never"
    where = f" -> {sink.path}" if getattr(sink, "path", None) else ""
    err.print(f"{args.mode}: {result.words} words, {result.audio_s:.2f} s of audio, first audible {audible} after the "
              f"first word, rtf {result.rtf or 0:.2f}, underruns {result.playback.underruns}{_pacing_note(result.times)}{where}")
    return 0


def _bench_tts(args: argparse.Namespace) -> int:
    import asyncio

    from agent.config import check_max_stretch
    from tts.eval.stream_bench import bench_tts, load_sentences
    from tts.inference.streaming import load_bundle

    s5, t5 = load_bundle("s5", args.s5_model), load_bundle("t5", args.t5_model)
    sentences = load_sentences(args.sentences)[: args.limit]
    if not sentences:
        raise ValueError("no sentences to benchmark")
    with _progress() as progress:
        result = asyncio.run(bench_tts(s5, t5, sentences, args.words_per_second, args.emit_every, quality=not args.no_quality,
                                       progress=progress, max_stretch=check_max_stretch(args.max_stretch)))
    _print_result(result, args.json, "streaming TTS benchmark")
    return 0


def _distill(args: argparse.Namespace) -> int:
    from tts.training.distill import DistillConfig, distill

    config = DistillConfig(out=str(args.out), max_steps=args.max_steps, max_minutes=args.max_minutes or 0.0,
                           asr_filter=not args.no_asr_filter, text_limit=args.text_limit, threads=args.threads)
    for name in ("teacher", "student", "data"):
        if getattr(args, name):
            setattr(config, name, str(getattr(args, name)))
    if args.speakers:
        config.speakers = args.speakers.split(",")
    path = args.sentences or Path(__file__).resolve().parents[1] / "configs" / "distill_sentences.txt"
    sentences = _read_sentences(path)
    with _progress() as progress:
        result = distill(config, sentences, progress)
    d_text = result["d_text"]
    err.print(f"distilled to step {result['steps']} in {config.out}; D_text kept {d_text['kept']}/{d_text['generated']} "
              f"teacher samples ({d_text['kept_fraction']:.0%}) with zero WER")
    return 0


def _print_result(result: dict, as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(result))
        return
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    Console().print(table)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="s5", description="Streaming voice agent with S5-TTS")
    commands = parser.add_subparsers(dest="command", required=True)

    chat = commands.add_parser("chat", help="terminal voice chat (Ollama if reachable, else the embedded LLM)")
    chat.add_argument("--llm", choices=["auto", "ollama", "embedded"], default=None)
    chat.add_argument("--tts", choices=["s5", "t5", "sentence"], default=None)
    chat.add_argument("--out", type=Path, default=None, help="write each turn as a WAV (and latency.jsonl) here instead of playing")
    chat.add_argument("--ollama-model", default=None)
    chat.add_argument("--ollama-host", default=None)
    chat.add_argument("--config", type=Path, default=None, help="agent YAML (default: configs/agent.yaml)")
    chat.set_defaults(func=_chat)

    rep = commands.add_parser("replay", help="run a YAML conversation script: one WAV per turn and latency records")
    rep.add_argument("script", type=Path)
    rep.add_argument("--tts", choices=["s5", "t5", "sentence"], default="s5")
    rep.add_argument("--out", type=Path, default=None, help="default: replay_out/SCRIPT")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=_replay)

    data = commands.add_parser("data", help="offline speech data")
    data_kinds = data.add_subparsers(dest="kind_", required=True)
    build = data_kinds.add_parser("build", help="synthesise a multi-speaker corpus from the local voices")
    build.add_argument("--hours", type=float, default=5.0)
    build.add_argument("--out", type=Path, required=True)
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--workers", type=int, default=2)
    build.add_argument("--voices", default="", help="comma-separated voice names (default: all)")
    build.add_argument("--text", type=Path, default=None, help="speak this file's sentences (one per line) instead of fortunes; added to the same corpus")
    build.set_defaults(func=_data_build)
    replies = data_kinds.add_parser("replies", help="conversational replies by the embedded LLM, as corpus text")
    replies.add_argument("--out", type=Path, default=Path("configs/llm_replies.txt"))
    replies.add_argument("--count", type=int, default=400, help="questions asked")
    replies.add_argument("--seed", type=int, default=0)
    replies.set_defaults(func=_data_replies)
    imp = data_kinds.add_parser("import", help="LibriTTS- or HiFiTTS-style directory to manifests")
    imp.add_argument("kind", choices=["libritts", "hifitts"])
    imp.add_argument("root", type=Path)
    imp.add_argument("--out", type=Path, required=True)
    imp.set_defaults(func=_data_import)

    codes = data_kinds.add_parser("codes", help="manifests to codec tokens (sharded, resumable)")
    codes.add_argument("--corpus", type=Path, required=True)
    codes.add_argument("--out", type=Path, required=True)
    codes.add_argument("--codec", type=Path, default=None, help="codec folder (default: the shipped codec)")
    codes.add_argument("--manifests", default="train,val,test,zeroshot")
    codes.add_argument("--speakers", default="", help="comma-separated speakers (default: all)")
    codes.set_defaults(func=_data_codes)

    train = commands.add_parser("train", help="train S5-TTS / T5-TTS (resumes from the run folder)")
    train.add_argument("--config", default="s5_default", help="config name or YAML with model: and train:")
    train.add_argument("--data", type=Path, default=None, help="tokenised corpus folder")
    train.add_argument("--out", type=Path, default=None, help="run folder")
    train.add_argument("--max-minutes", type=float, default=None)
    train.add_argument("--max-steps", type=int, default=None)
    train.add_argument("--speakers", default="", help="comma-separated training speakers (default: all)")
    train.add_argument("--threads", type=int, default=0)
    train.add_argument("--init-from", type=Path, default=None, help="start a new run from exported weights (e.g. tts/assets/models/s5_default)")
    train.add_argument("--codec", type=Path, default=None, help="the codec the data was tokenised with (for audio samples and the export); default: the config's")
    train.add_argument("--restart-schedule", action="store_true", help="with --init-from: start at step 0 (warm-up and prior anew; for a new codec)")
    train.set_defaults(func=_train)

    dist = commands.add_parser("distill", help="IMSD: distil a full-context T5 teacher into an S5 student")
    dist.add_argument("--teacher", type=Path, default=None, help="exported T5 model (default: the shipped one)")
    dist.add_argument("--student", type=Path, default=None, help="exported S5 model to start from (default: the shipped one)")
    dist.add_argument("--data", type=Path, default=None, help="tokenised corpus (D_audio)")
    dist.add_argument("--sentences", type=Path, default=None, help="D_text, one sentence per line (default: configs/distill_sentences.txt)")
    dist.add_argument("--text-limit", type=int, default=200)
    dist.add_argument("--no-asr-filter", action="store_true", help="keep every teacher sample (default: zero-WER ones only)")
    dist.add_argument("--out", type=Path, default=Path("runs/s5_distilled"))
    dist.add_argument("--max-steps", type=int, default=1000)
    dist.add_argument("--max-minutes", type=float, default=None)
    dist.add_argument("--speakers", default="")
    dist.add_argument("--threads", type=int, default=0)
    dist.set_defaults(func=_distill)

    ev = commands.add_parser("eval", help="streaming synthesis quality: WER/CER, similarity, DNSMOS, RTF")
    ev.add_argument("--model", type=Path, default=None, help="exported model folder (default: the shipped one for --mode)")
    ev.add_argument("--mode", choices=["s5", "t5"], default="s5", help="which shipped checkpoint to evaluate")
    ev.add_argument("--codec", type=Path, default=None)
    ev.add_argument("--sentences", type=Path, default=None, help="one sentence per line (default: the test split)")
    ev.add_argument("--corpus", type=Path, default=Path("corpus"))
    ev.add_argument("--limit", type=int, default=30)
    ev.add_argument("--reference-voice", default="piper_joe")
    ev.add_argument("--zero-shot", action="store_true", help="prompt with a held-out speaker's clip (flite_rms); similarity is to that clip")
    ev.add_argument("--out", type=Path, default=None, help="write the synthesised WAVs here")
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(func=_eval)

    codec = commands.add_parser("codec", help="the built-in codec")
    codec_kinds = codec.add_subparsers(dest="kind_", required=True)
    features = codec_kinds.add_parser("features", help="WORLD analysis of a corpus (cached, resumable)")
    features.add_argument("--corpus", type=Path, required=True)
    features.add_argument("--workers", type=int, default=2)
    features.add_argument("--manifests", default="train,val,test,zeroshot")
    features.add_argument("--speakers", default="", help="comma-separated speakers (default: all)")
    features.add_argument("--per-speaker", type=int, default=None, help="at most N utterances per speaker and manifest")
    features.set_defaults(func=_codec_features)
    codec_train = codec_kinds.add_parser("train", help="train the FSQ codec on a corpus")
    codec_train.add_argument("--kind", choices=["mel", "world"], default="mel",
                             help="mel: FSQ over log-mel, voiced by HiFi-GAN (default); world: FSQ over WORLD features")
    codec_train.add_argument("--corpus", type=Path, required=True)
    codec_train.add_argument("--frame-rate", type=float, default=21.5, help="86, 43 or 21.5 frames/s")
    codec_train.add_argument("--minutes", type=float, default=25.0)
    codec_train.add_argument("--workers", type=int, default=2)
    codec_train.add_argument("--per-speaker", type=int, default=60, help="training utterances per speaker")
    codec_train.add_argument("--spectrum-weighting", choices=["uniform", "variance", "low_order"], default=None,
                             help="spectral loss weights (default: uniform, or the --init-from codec's)")
    codec_train.add_argument("--max-hours", type=float, default=3.0, help="training audio loaded, taken round-robin over voices")
    codec_train.add_argument("--out", type=Path, default=None, help="default: the shipped codec folder")
    codec_train.add_argument("--low-order-boost", type=float, default=None, help="with low_order weighting (default 3)")
    codec_train.add_argument("--init-from", type=Path, default=None, help="start from this codec folder")
    codec_train.add_argument("--decoder-only", action="store_true",
                             help="train only the decoder (the --init-from codec's codes stay valid)")
    codec_train.add_argument("--decoder-channels", type=int, default=None, help="decoder width (default: as the encoder)")
    codec_train.add_argument("--delta-weight", type=float, default=0.0, help="loss on the spectrum's frame-to-frame change")
    codec_train.add_argument("--lr", type=float, default=None, help="peak learning rate (default: 1e-3 mel, 2e-3 world)")
    codec_train.add_argument("--speakers", default="", help="mel: comma-separated voices to learn (default: all)")
    codec_train.set_defaults(func=_codec_train)
    vocoder = codec_kinds.add_parser("vocoder", help="distil a cheaper HiFi-GAN from the V1 universal one")
    vocoder.add_argument("--corpus", type=Path, required=True)
    vocoder.add_argument("--out", type=Path, required=True, help="the vocoder folder (resumes from its train_state.pt)")
    vocoder.add_argument("--codec", default="tts/assets/mel_codec", help="the mel codec whose decoded log-mel it learns on")
    vocoder.add_argument("--kernels", default="3,7", help="the V1 resblock kernels the student keeps")
    vocoder.add_argument("--minutes", type=float, default=60.0)
    vocoder.add_argument("--batch", type=int, default=6)
    vocoder.add_argument("--lr", type=float, default=1e-4)
    vocoder.add_argument("--utterances", type=int, default=800)
    vocoder.add_argument("--threads", type=int, default=0)
    vocoder.add_argument("--init-from", default=None, help="continue from a saved student (fresh optimizer)")
    vocoder.set_defaults(func=_codec_vocoder)

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
    say.set_defaults(func=_say)

    bench = commands.add_parser("bench", help="benchmarks")
    bench_kinds = bench.add_subparsers(dest="kind", required=True)
    model = bench_kinds.add_parser("model", help="parameters, train step time, cached vs naive decoding")
    model.add_argument("--json", action="store_true", help="print one JSON object")
    model.add_argument("--config", default="s5_default", help="model config name or YAML path")
    model.add_argument("--frames", type=int, default=300, help="frames decoded per mode")
    model.set_defaults(func=_bench_model)
    codec_bench = bench_kinds.add_parser("codec", help="codec round-trip quality and decoding speed")
    codec_bench.add_argument("--json", action="store_true")
    codec_bench.add_argument("--manifest", type=Path, default=Path("corpus/test.jsonl"), help="unseen sentences (default: the corpus's test split)")
    codec_bench.add_argument("--speaker", default="piper_joe", help="the voice measured (the one the TTS speaks); 'all' for every voice")
    codec_bench.add_argument("--sentences", type=Path, default=None, help="speak these (one per line) with --speaker instead of reading a manifest")
    codec_bench.add_argument("--no-quality", action="store_true", help="decoding speed only (no ASR, similarity, DNSMOS)")
    codec_bench.add_argument("--codec", type=Path, default=None)
    codec_bench.add_argument("--vocoder", default=None, help="voice the mel codec with this vocoder: 'universal' or a folder")
    codec_bench.add_argument("--limit", type=int, default=40, help="utterances evaluated")
    codec_bench.set_defaults(func=_bench_codec)
    tts_bench = bench_kinds.add_parser("tts", help="s5, t5 and sentence mode side by side: latency, rtf, underruns")
    tts_bench.add_argument("--json", action="store_true")
    tts_bench.add_argument("--words-per-second", type=float, default=3.0)
    tts_bench.add_argument("--sentences", type=Path, default=None, help="one sentence per line (default: configs/bench_sentences.txt)")
    tts_bench.add_argument("--limit", type=int, default=None)
    tts_bench.add_argument("--emit-every", type=int, default=None, help="t5/sentence: decoder steps per chunk (default: 0.35 s of frames, the paper's 30 steps at 86 frames/s)")
    tts_bench.add_argument("--s5-model", type=Path, default=None)
    tts_bench.add_argument("--t5-model", type=Path, default=None)
    tts_bench.add_argument("--no-quality", action="store_true", help="skip the streaming-vs-offline S5 comparison")
    tts_bench.add_argument("--max-stretch", type=float, default=None, help=STRETCH_HELP)
    tts_bench.set_defaults(func=_bench_tts)
    e2e = bench_kinds.add_parser("e2e", help="S5 vs T5 vs sentence mode on one replayed LLM stream (the paper's Table 4)")
    e2e.add_argument("--json", action="store_true")
    e2e.add_argument("--script", type=Path, default=None, help="replay YAML (default: examples/bench_e2e.yaml)")
    e2e.add_argument("--first-token-ms", type=float, default=None)
    e2e.add_argument("--tokens-per-second", type=float, default=None)
    e2e.add_argument("--s5-model", type=Path, default=None)
    e2e.add_argument("--t5-model", type=Path, default=None)
    e2e.set_defaults(func=_bench_e2e)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except (FileNotFoundError, ValueError, RuntimeError, OSError) as error:
        err.print(f"[red]error:[/] {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
