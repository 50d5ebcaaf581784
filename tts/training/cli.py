"""`s5 data build|import|codes`, `s5 codec train|vocoder`, `s5 train`, `s5 distill`."""
from __future__ import annotations

import argparse
from pathlib import Path

from audio_io.errors import UserError
from tts.cli import err, progress_bar, read_sentences
from tts.paths import CONFIGS


def _data_build(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from tts.data.corpus import CorpusConfig, build_corpus

    if args.text and not args.text.exists():
        raise UserError(f"no text file {args.text}")
    config = CorpusConfig(hours=args.hours, seed=args.seed, workers=args.workers, text_file=str(args.text or ""))
    if args.voices:
        config.voices = args.voices.split(",")
        config.held_out = [v for v in config.held_out if v in config.voices]
    columns = (TextColumn("{task.description:>18}"), BarColumn(), TextColumn("{task.completed:>7.0f}/{task.total:.0f} s"), TimeRemainingColumn())
    with Progress(*columns, console=err) as progress:
        counts = build_corpus(config, args.out, progress)
    err.print(f"corpus in {args.out}: " + ", ".join(f"{name} {n}" for name, n in counts.items()))
    return 0


def _data_compact(args: argparse.Namespace) -> int:
    from tts.data.corpus import compact_corpus

    counts = compact_corpus(args.corpus, args.out, args.speaker, args.utterances, args.seed)
    err.print(f"{args.out}: {counts['utterances']} utterances, {counts['hours']} h, {counts['megabytes']} MB of FLAC")
    return 0


def _data_import(args: argparse.Namespace) -> int:
    from tts.data.corpus import import_corpus

    counts = import_corpus(args.kind, args.root, args.out)
    err.print(f"manifests in {args.out}: " + ", ".join(f"{name} {n}" for name, n in counts.items()))
    return 0


def _data_codes(args: argparse.Namespace) -> int:
    from tts.codec.load import load_codec
    from tts.data.tokens import record_codec, tokenize_manifest
    from tts.frontend.g2p import G2P

    codec = load_codec(args.codec)
    record_codec(args.out, str(args.codec or ""))
    g2p = G2P()
    with progress_bar() as progress:
        for manifest in args.manifests.split(","):
            if (args.corpus / f"{manifest}.jsonl").exists():
                speakers = args.speakers.split(",") if args.speakers else None
                tokenize_manifest(args.corpus, manifest, codec, args.out, g2p, progress, speakers)
    err.print(f"codec tokens in {args.out}")
    return 0


def _codec_train(args: argparse.Namespace) -> int:
    from tts.codec.load import load_codec
    from tts.codec.mel_codec import MelCodec, MelCodecConfig
    from tts.training.mel_codec_train import MelCodecTrainConfig, train_mel_codec

    stack = {86: 1, 43: 2, 21: 4, 22: 4}.get(round(args.frame_rate))
    if stack is None:
        raise UserError(f"--frame-rate {args.frame_rate}: the mel codec runs at 86, 43 or 21.5 frames/s")
    if args.out is None:
        raise UserError("--out is required for the mel codec (the shipped one is tts/assets/mel_codec)")
    speakers = args.speakers.split(",") if args.speakers else None
    train_config = MelCodecTrainConfig(minutes=args.minutes, max_hours=args.max_hours, speakers=speakers,
                                       **({"lr": args.lr} if args.lr is not None else {}))
    saved = None
    if args.decoder_of is not None:
        saved = load_codec(args.decoder_of)
        if not isinstance(saved, MelCodec):
            raise UserError(f"--decoder-of {args.decoder_of}: not a mel codec")
        stack = saved.config.stack
    args.out.mkdir(parents=True, exist_ok=True)
    with progress_bar() as progress:
        codec, log = train_mel_codec(args.corpus, MelCodecConfig(stack=stack, decoder_lookahead=args.decoder_lookahead),
                                     train_config, progress, args.out / "train_log.jsonl", checkpoint=args.out,
                                     decoder_of=saved)
    err.print(f"mel codec ({codec.frame_rate:.2f} frames/s) saved to {args.out}; validation: {log}")
    return 0


def _check_device(name: str) -> None:
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown torch device {name!r} (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {name!r}: this machine has no CUDA GPU (--device cpu, or the recipe's train.device)")


def _codec_campaign(args: argparse.Namespace) -> int:
    from tts.training.vocoder_campaign import judge_snapshots, load_campaign_config, run_campaign, train_unjudged

    config = load_campaign_config(args.config)
    if args.device:
        config.train.device = args.device
    log = lambda line: err.print(line, highlight=False)  # noqa: E731
    if args.judge:
        judge_snapshots(config, args.judge, args.run or args.config.stem, log=log)
        err.print(f"judged {len(args.judge)} snapshots into {config.checkpoint_dir}/progress.jsonl")
        return 0
    _check_device(config.train.device)  # before a corpus is built or weights are loaded
    if args.snapshots_to:
        if args.snapshots < 1:
            raise UserError(f"--snapshots must be 1 or more (got {args.snapshots})")
        result = train_unjudged(config, args.minutes, args.snapshots_to, args.snapshots, log=log)
        err.print(f"{result['steps']} steps in {result['minutes']} minutes; snapshots in {args.snapshots_to} "
                  f"(judge them with --judge)")
        return 0
    result = run_campaign(config, args.minutes, log=log)
    err.print(f"campaign at step {result['steps']} ({result['minutes']} minutes this session); curve in "
              f"{config.checkpoint_dir}/progress.jsonl")
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
        raise UserError(f"{args.codec} is not a mel codec: the vocoder learns from a mel codec's decoded log-mel")
    if args.kind == "istft":
        from tts.codec.istft_vocoder import IstftVocoderConfig
        from tts.training.istft_vocoder_train import IstftTrainConfig, train_istft_vocoder

        train_config = IstftTrainConfig(minutes=args.minutes, batch=args.batch or 16, lr=args.lr or 5e-4,
                                        utterances=args.utterances, teacher=args.teacher,
                                        init_from=args.init_from or "", adversarial=args.adversarial,
                                        adv_weight=args.adv_weight, fm_weight=args.fm_weight,
                                        disc_real=args.disc_real)
        with progress_bar() as progress:
            log = train_istft_vocoder(args.corpus, codec, args.out, IstftVocoderConfig(), train_config, progress)
        err.print(f"iSTFT vocoder saved to {args.out}: {log['steps']} steps in {log['minutes']} minutes")
        return 0
    config = VocoderDistillConfig(resblock_kernel_sizes=[int(k) for k in args.kernels.split(",")], minutes=args.minutes,
                                  batch=args.batch or 6, lr=args.lr or 1e-4, utterances=args.utterances, init_from=args.init_from or "")
    with progress_bar() as progress:
        log = distill_vocoder(args.corpus, codec, args.out, config, progress)
    err.print(f"vocoder saved to {args.out}: {log['steps']} steps in {log['minutes']} minutes")
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
        raise UserError("--restart-schedule goes with --init-from")
    if args.codec:
        config.codec_dir = str(args.codec)
    config.restart_schedule = args.restart_schedule
    with progress_bar() as progress:
        step = train(model_config, config, progress)
    err.print(f"trained to step {step}; checkpoint and export in {config.out}")
    return 0


def _distill(args: argparse.Namespace) -> int:
    from tts.training.distill import DistillConfig, distill, distill_schedule

    schedule = distill_schedule(out=str(args.out), max_steps=args.max_steps, max_minutes=args.max_minutes or 0.0,
                                threads=args.threads)
    if args.data:
        schedule.data = str(args.data)
    if args.speakers:
        schedule.speakers = args.speakers.split(",")
    config = DistillConfig(asr_filter=not args.no_asr_filter, text_limit=args.text_limit, train=schedule)
    for name in ("teacher", "student"):
        if getattr(args, name):
            setattr(config, name, str(getattr(args, name)))
    path = args.sentences or CONFIGS / "distill_sentences.txt"
    sentences = read_sentences(path)
    with progress_bar() as progress:
        result = distill(config, sentences, progress)
    d_text = result["d_text"]
    err.print(f"distilled to step {result['steps']} in {config.train.out}; D_text kept {d_text['kept']}/{d_text['generated']} "
              f"teacher samples ({d_text['kept_fraction']:.0%}) with zero WER")
    return 0


def register(commands: argparse._SubParsersAction, data_kinds: argparse._SubParsersAction) -> None:
    """Add training's subcommands: `data_kinds` is the `s5 data` group (the agent adds `replies` to it)."""
    build = data_kinds.add_parser("build", help="synthesise a multi-speaker corpus from the local voices")
    build.add_argument("--hours", type=float, default=5.0)
    build.add_argument("--out", type=Path, required=True)
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--workers", type=int, default=2)
    build.add_argument("--voices", default="", help="comma-separated voice names (default: all)")
    build.add_argument("--text", type=Path, default=None, help="speak this file's sentences (one per line) instead of fortunes; added to the same corpus")
    build.set_defaults(func=_data_build)
    compact = data_kinds.add_parser("compact", help="one speaker's vocoder training utterances with FLAC audio: a "
                                    "corpus to carry to a machine that cannot build one")
    compact.add_argument("--corpus", type=Path, default=Path("corpus"))
    compact.add_argument("--out", type=Path, required=True)
    compact.add_argument("--speaker", default="piper_joe")
    compact.add_argument("--utterances", type=int, default=400)
    compact.add_argument("--seed", type=int, default=0, help="the selection's seed (a vocoder recipe's `seed`)")
    compact.set_defaults(func=_data_compact)
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

    codec = commands.add_parser("codec", help="the built-in codec")
    codec_kinds = codec.add_subparsers(dest="kind_", required=True)
    codec_train = codec_kinds.add_parser("train", help="train the FSQ mel codec on a corpus")
    codec_train.add_argument("--corpus", type=Path, required=True)
    codec_train.add_argument("--frame-rate", type=float, default=21.5, help="86, 43 or 21.5 frames/s")
    codec_train.add_argument("--minutes", type=float, default=25.0)
    codec_train.add_argument("--max-hours", type=float, default=3.0, help="training audio loaded, taken round-robin over voices")
    codec_train.add_argument("--out", type=Path, default=None, help="the new codec's folder (the shipped one is tts/assets/mel_codec)")
    codec_train.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-3)")
    codec_train.add_argument("--speakers", default="", help="comma-separated voices to learn (default: all)")
    codec_train.add_argument("--decoder-of", type=Path, default=None,
                             help="train only a new decoder for this codec (its encoder and codes stay; --frame-rate ignored)")
    codec_train.add_argument("--decoder-lookahead", type=int, default=1, choices=[0, 1],
                             help="codec frames the decoder waits for (0: causal, 46 ms less latency at 21.5 frames/s)")
    codec_train.set_defaults(func=_codec_train)
    vocoder = codec_kinds.add_parser("vocoder", help="train a vocoder for the mel codec: a HiFi-GAN distilled from V1, "
                                     "or the iSTFT one (--kind istft)")
    vocoder.add_argument("--kind", choices=["hifigan", "istft"], default="hifigan",
                         help="hifigan: V1 with fewer kernels; istft: Vocos-style; both learn V1's output")
    vocoder.add_argument("--corpus", type=Path, required=True)
    vocoder.add_argument("--out", type=Path, required=True, help="the vocoder folder (resumes from its train_state.pt)")
    vocoder.add_argument("--codec", default="tts/assets/mel_codec", help="the mel codec whose decoded log-mel it learns on")
    vocoder.add_argument("--kernels", default="3,7", help="the V1 resblock kernels the student keeps")
    vocoder.add_argument("--minutes", type=float, default=60.0)
    vocoder.add_argument("--batch", type=int, default=0, help="default 6 (hifigan) or 16 (istft)")
    vocoder.add_argument("--lr", type=float, default=0.0, help="default 1e-4 (hifigan) or 5e-4 (istft)")
    vocoder.add_argument("--utterances", type=int, default=800)
    vocoder.add_argument("--teacher", default="universal",
                         help="istft: the vocoder whose audio it learns ('universal': HiFi-GAN V1; '' for the recordings)")
    vocoder.add_argument("--threads", type=int, default=0)
    vocoder.add_argument("--init-from", default=None, help="continue from a saved student (fresh optimizer)")
    vocoder.add_argument("--adversarial", action="store_true", help="istft: add discriminators that judge its audio")
    vocoder.add_argument("--disc-real", choices=["teacher", "recordings"], default="teacher",
                         help="what the discriminators take for real: the teacher's audio of the same log-mel, or the recordings")
    vocoder.add_argument("--adv-weight", type=float, default=0.1, help="the hinge loss's weight (the mel L1's is 1)")
    vocoder.add_argument("--fm-weight", type=float, default=0.1, help="feature matching's weight")
    vocoder.set_defaults(func=_codec_vocoder)
    campaign = codec_kinds.add_parser("campaign", help="start or resume the adversarial vocoder campaign (a recipe "
                                      "file; weights and its curve committed under its checkpoint_dir)")
    campaign.add_argument("--config", type=Path, default=CONFIGS / "vocoder_gan.yaml")
    campaign.add_argument("--minutes", type=float, default=60.0, help="this session's share of the campaign")
    campaign.add_argument("--device", default=None, help="train on this torch device (cuda); default: the recipe's")
    campaign.add_argument("--snapshots-to", type=Path, default=None,
                          help="train without judging (a machine without the judges), writing the generator "
                               "--snapshots times into this folder's step_<N>/")
    campaign.add_argument("--snapshots", type=int, default=4)
    campaign.add_argument("--judge", type=Path, nargs="+", default=None,
                          help="score step_<N>/ snapshots of a --snapshots-to run into the campaign's curve")
    campaign.add_argument("--run", default=None, help="the name --judge gives that run in the curve (default: the recipe's)")
    campaign.set_defaults(func=_codec_campaign)


def main(argv: list[str] | None = None) -> int:
    """`python -m tts.training.cli codec ... | data ...`: the training commands alone, for a machine that has the
    training's packages (torch, numpy, scipy, soundfile, safetensors, pyyaml, rich) and not the agent's (a rented
    GPU): `s5` is the same parser with the agent's commands beside these."""
    parser = argparse.ArgumentParser(prog="python -m tts.training.cli")
    commands = parser.add_subparsers(dest="command", required=True)
    data_kinds = commands.add_parser("data", help="offline speech data").add_subparsers(dest="kind_", required=True)
    register(commands, data_kinds)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as error:  # as `s5` does: what the user can fix is one line
        err.print(f"error: {error}", highlight=False, markup=False)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
