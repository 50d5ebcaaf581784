"""`s5 eval` and `s5 bench model|codec|tts`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from audio_io.errors import UserError
from tts.cli import notice, print_result, progress_bar, read_sentences
from tts.paths import CONFIGS

DEFAULT_CODEC_MANIFEST = Path("corpus/test.jsonl")


def _eval(args: argparse.Namespace) -> int:
    from tts.eval.evaluate import evaluate, heldout_sentences
    from tts.inference.streaming import load_bundle

    bundle = load_bundle(args.mode, args.model, args.codec, vocoder=args.vocoder)
    if args.long:
        from tts.eval.evaluate import evaluate_long

        replies = read_sentences(args.sentences or CONFIGS / "long_replies.txt")[: args.limit]
        with progress_bar() as progress:
            result = evaluate_long(bundle, replies, args.mode, args.reference_voice, out_dir=args.out, progress=progress)
        result["vocoder"] = bundle.codec.config.vocoder if hasattr(bundle.codec, "config") else "codec's own"
        print_result(result, args.json, "S5-TTS long replies")
        return 0
    if args.cfg_scale != 1.0 and bundle.model.null_memory is None:
        raise UserError("--cfg-scale: this model was trained without cfg_dropout (no unconditional row to guide with)")
    if args.sentences:
        sentences = read_sentences(args.sentences)[: args.limit]
    else:
        sentences = heldout_sentences(args.corpus, limit=args.limit)
    prompt = clip = None
    if args.zero_shot:
        from tts.eval.evaluate import zero_shot_prompt

        prompt, clip = zero_shot_prompt(bundle)
    with progress_bar() as progress:
        result = evaluate(bundle, sentences, args.reference_voice, out_dir=args.out, progress=progress, prompt=prompt,
                          speaker_clip=clip, mode=args.mode, cfg_scale=args.cfg_scale)
    result["zero_shot"] = bool(args.zero_shot)
    result["vocoder"] = bundle.codec.config.vocoder if hasattr(bundle.codec, "config") else "codec's own"
    print_result(result, args.json, "S5-TTS evaluation")
    return 0


def _bench_model(args: argparse.Namespace) -> int:
    from tts.eval.model_bench import ModelBenchConfig, run_model_bench

    bench = ModelBenchConfig(config=args.config, decode_frames=args.frames)
    with progress_bar() as progress:
        result = run_model_bench(bench, progress)
    print_result(result, args.json, "S5-TTS model benchmark")
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
    if args.vocoder and not hasattr(codec, "use_vocoder"):
        raise UserError(f"--vocoder goes with a mel codec ({args.codec} is not one)")
    speaker = None if args.speaker == "all" else args.speaker
    if not args.sentences and args.manifest == DEFAULT_CODEC_MANIFEST and not args.manifest.exists():
        args.sentences = CONFIGS / "eval_replies.txt"  # a fresh clone has no corpus: unseen replies, spoken now
        notice(f"no corpus here ({args.manifest}): the Piper voice speaks {args.sentences.name} instead")
    if args.sentences:
        clips = voice_clips(read_sentences(args.sentences)[: args.limit], speaker or "piper_joe")
        source = {"sentences": str(args.sentences)}
    else:
        if not args.manifest.exists():
            raise UserError(f"no manifest {args.manifest} (build a corpus with `s5 data build`, or pass --sentences FILE)")
        clips = manifest_clips(args.manifest, args.limit, speaker)
        voices, hours = corpus_summary(args.manifest.parent)
        source = {"manifest": str(args.manifest), "voices": voices, "hours": round(hours, 2)}
    for name in args.vocoder or [None]:  # several: the same clips (one speaking) through each, one result each
        if name:
            codec.use_vocoder(name)
        with progress_bar() as progress:
            result = run_codec_bench(codec, clips, progress, quality=not args.no_quality)
        vocoder = {"vocoder": codec.config.vocoder} if hasattr(codec, "use_vocoder") else {}
        print_result({**result, **source, **vocoder, "speaker": speaker or "all"}, args.json, "codec round trip")
    return 0


def _bench_renders(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.table import Table

    from tts.eval.codec_bench import render_costs
    from tts.inference.streaming import load_bundle

    try:
        pushes = tuple(int(n) for n in args.push_frames.split(","))
        streams = tuple(int(n) for n in args.streams.split(","))
    except ValueError:
        pushes = streams = ()
    if not pushes or not streams or min(pushes + streams) < 1:
        raise UserError("--push-frames and --streams: comma-separated counts of at least 1, e.g. 1,4,16")
    torch.set_num_threads(1)  # as the server's render thread
    codec = load_bundle("s5", vocoder=args.vocoder, render_threads=1).codec
    with torch.inference_mode():
        result = render_costs(codec, pushes, streams)
    result["vocoder"] = getattr(codec.config, "vocoder", None)
    if args.json:
        print(json.dumps(result))
        return 0
    table = Table(title=f"CPU ms of one thread per second of audio ({result['vocoder']})")
    table.add_column("frames a push", justify="right")
    for n in streams:
        table.add_column(f"{n} stream{'s' if n > 1 else ''} together" if n > 1 else "1 stream", justify="right")
    for row in result["rows"]:
        table.add_row(str(row["push_frames"]), *(str(row[f"ms_per_audio_s_{n}_streams"]) for n in streams))
    Console().print(table)
    return 0


def _bench_tts(args: argparse.Namespace) -> int:
    import asyncio

    from tts.eval.stream_bench import BENCH_SENTENCES, bench_tts
    from tts.inference.streaming import load_bundle

    s5 = load_bundle("s5", args.s5_model, vocoder=args.vocoder)
    t5 = load_bundle("t5", args.t5_model, vocoder=args.vocoder)
    sentences = read_sentences(args.sentences or BENCH_SENTENCES)[: args.limit]
    if not sentences:
        raise UserError("no sentences to benchmark")
    with progress_bar() as progress:
        result = asyncio.run(bench_tts(s5, t5, sentences, args.words_per_second, args.emit_every, quality=not args.no_quality,
                                       progress=progress, max_stretch=args.max_stretch))
    print_result(result, args.json, "streaming TTS benchmark")
    return 0


def _bench_words(args: argparse.Namespace) -> int:
    from tts.eval.word_times import bench_word_times
    from tts.inference.streaming import load_bundle

    bundle = load_bundle(args.mode, args.model, vocoder=args.vocoder)
    sentences = read_sentences(args.sentences or CONFIGS / "eval_replies.txt")[: args.limit]
    with progress_bar() as progress:
        result = bench_word_times(bundle, sentences, args.mode, progress)
    print_result(result, args.json, "word times against Whisper")
    return 0


def register(commands: argparse._SubParsersAction, bench_kinds: argparse._SubParsersAction) -> None:
    """Add `s5 eval` and the TTS benchmarks: `bench_kinds` is the `s5 bench` group (the agent adds `e2e` to it).
    The settings a listener hears (mode, vocoder, guidance, pacing) come from the agent's resolver, which adds
    their flags and sets `args.mode`, `args.vocoder`, `args.cfg_scale`, `args.emit_every`, `args.max_stretch`
    (`agent/cli.py`)."""
    ev = commands.add_parser("eval", help="streaming synthesis quality: WER/CER, similarity, DNSMOS, RTF")
    ev.add_argument("--model", type=Path, default=None, help="exported model folder (default: the shipped one for --mode)")
    ev.add_argument("--long", action="store_true",
                    help="long replies (default configs/long_replies.txt, one per line), each one turn: WER over the "
                         "whole audio, seconds per word and pauses against the reference voice")
    ev.add_argument("--codec", type=Path, default=None)
    ev.add_argument("--sentences", type=Path, default=None, help="one sentence per line (default: the test split)")
    ev.add_argument("--corpus", type=Path, default=Path("corpus"))
    ev.add_argument("--limit", type=int, default=30)
    ev.add_argument("--reference-voice", default="piper_joe")
    ev.add_argument("--zero-shot", action="store_true", help="prompt with a held-out speaker's clip (flite_rms); similarity is to that clip")
    ev.add_argument("--out", type=Path, default=None, help="write the synthesised WAVs here")
    ev.add_argument("--json", action="store_true")
    ev.set_defaults(func=_eval)

    model = bench_kinds.add_parser("model", help="parameters, train step time, cached vs naive decoding")
    model.add_argument("--json", action="store_true", help="print one JSON object")
    model.add_argument("--config", default="s5_default", help="model config name or YAML path")
    model.add_argument("--frames", type=int, default=300, help="frames decoded per mode")
    model.set_defaults(func=_bench_model)
    codec_bench = bench_kinds.add_parser("codec", help="codec round-trip quality and decoding speed")
    codec_bench.add_argument("--json", action="store_true")
    codec_bench.add_argument("--manifest", type=Path, default=DEFAULT_CODEC_MANIFEST,
                             help="unseen sentences (default: the corpus's test split; without a corpus, configs/eval_replies.txt spoken by the Piper voice)")
    codec_bench.add_argument("--speaker", default="piper_joe", help="the voice measured (the one the TTS speaks); 'all' for every voice")
    codec_bench.add_argument("--sentences", type=Path, default=None, help="speak these (one per line) with --speaker instead of reading a manifest")
    codec_bench.add_argument("--no-quality", action="store_true", help="decoding speed only (no ASR, similarity, DNSMOS)")
    codec_bench.add_argument("--codec", type=Path, default=None)
    codec_bench.add_argument("--vocoder", nargs="+", default=None,
                             help="voice the mel codec with this vocoder: 'universal', 'fast' or a folder; several "
                                  "compare them on the same clips (the Piper voice speaks anew each run), one result each")
    codec_bench.add_argument("--limit", type=int, default=40, help="utterances evaluated")
    codec_bench.set_defaults(func=_bench_codec)
    renders = bench_kinds.add_parser("renders", help="what a render costs per second of audio, by push length and "
                                     "streams rendered together (the server's render thread, one torch thread)")
    renders.add_argument("--json", action="store_true")
    renders.add_argument("--push-frames", default="1,4,16", help="codec frames a push (comma-separated)")
    renders.add_argument("--streams", default="1,4,8", help="streams whose pushes render in one pass (comma-separated)")
    renders.add_argument("--vocoder", default="fast", help="'fast', 'universal' or a folder (default: fast, the "
                         "server's usual voice)")
    renders.set_defaults(func=_bench_renders)
    words = bench_kinds.add_parser("words", help="S5's word times against Whisper's word timestamps, beside Whisper's "
                                   "own error on Piper speech whose word starts are exact")
    words.add_argument("--json", action="store_true")
    words.add_argument("--sentences", type=Path, default=None, help="unseen sentences (default configs/eval_replies.txt)")
    words.add_argument("--limit", type=int, default=40)
    words.add_argument("--model", type=Path, default=None)
    words.set_defaults(func=_bench_words)
    tts_bench = bench_kinds.add_parser("tts", help="s5, t5 and sentence mode side by side: latency, rtf, underruns")
    tts_bench.add_argument("--json", action="store_true")
    tts_bench.add_argument("--words-per-second", type=float, default=3.0)
    tts_bench.add_argument("--sentences", type=Path, default=None, help="one sentence per line (default: configs/bench_sentences.txt)")
    tts_bench.add_argument("--limit", type=int, default=None)
    tts_bench.add_argument("--s5-model", type=Path, default=None)
    tts_bench.add_argument("--t5-model", type=Path, default=None)
    tts_bench.add_argument("--no-quality", action="store_true", help="skip the streaming-vs-offline S5 comparison")
    tts_bench.set_defaults(func=_bench_tts)
