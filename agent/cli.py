"""The `s5` command."""
from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

err = Console(stderr=True)


def _bench_model(args: argparse.Namespace) -> int:
    from tts.bench import ModelBenchConfig, run_model_bench

    bench = ModelBenchConfig(config=args.config, decode_frames=args.frames)
    with Progress(console=err, transient=True) as progress:
        result = run_model_bench(bench, progress)
    if args.json:
        print(json.dumps(result))
    else:
        table = Table(title="S5-TTS model benchmark")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in result.items():
            table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
        Console().print(table)
    return 0


def _chat(args: argparse.Namespace) -> int:
    err.print(
        "[yellow]s5 chat:[/] no trained S5-TTS checkpoint ships yet, so there is no voice to speak with. "
        "The model core is in place; the data, training and agent land with the next issues."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="s5", description="Streaming voice agent with S5-TTS")
    commands = parser.add_subparsers(dest="command", required=True)

    chat = commands.add_parser("chat", help="terminal voice chat on the embedded defaults")
    chat.set_defaults(func=_chat)

    bench = commands.add_parser("bench", help="benchmarks")
    bench_kinds = bench.add_subparsers(dest="kind", required=True)
    model = bench_kinds.add_parser("model", help="parameters, train step time, cached vs naive decoding")
    model.add_argument("--json", action="store_true", help="print one JSON object")
    model.add_argument("--config", default="s5_default", help="model config name or YAML path")
    model.add_argument("--frames", type=int, default=300, help="frames decoded per mode")
    model.set_defaults(func=_bench_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except (FileNotFoundError, ValueError) as error:
        err.print(f"[red]error:[/] {error}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
