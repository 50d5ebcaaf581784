"""What every package's `s5` subcommands share: the stderr console, progress bars, sentence files, result tables.
Each package registers its own subcommands (`tts/training/cli.py`, `tts/eval/cli.py`, `agent/cli.py`); handlers
import their heavy modules when they run, so building the parser loads no model code."""
from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from audio_io.errors import UserError

err = Console(stderr=True, soft_wrap=True)  # one error, one line, whatever the terminal width


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description:>22}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err)


def notice(message: str) -> None:
    err.print(f"[yellow]{escape(message)}[/]")


def read_sentences(path: Path) -> list[str]:
    """One sentence per line; blank lines and '#' comments skipped."""
    if not path.exists():
        raise UserError(f"no sentence file {path}")
    sentences = [l.strip() for l in path.read_text().splitlines() if l.strip() and not l.lstrip().startswith("#")]
    if not sentences:
        raise UserError(f"no sentences in {path}")
    return sentences


def print_result(result: dict, as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(result))
        return
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:,}" if isinstance(value, int) else str(value))
    Console().print(table)
