"""Captions from word times: SubRip (`.srt`) or WebVTT (`.vtt`), one cue per word (`s5 say --captions`)."""
from __future__ import annotations

from pathlib import Path

from audio_io.errors import UserError
from tts.inference.stream_parts import WordTime


def _stamp(seconds: float, separator: str) -> str:
    ms = max(0, round(seconds * 1000))
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{separator}{ms % 1000:03d}"


def captions(words: list[WordTime], kind: str) -> str:
    """The cues as text; kind "srt" or "vtt"."""
    separator = "," if kind == "srt" else "."
    cues = []
    for n, word in enumerate(words, 1):
        end = max(word.end_s, word.start_s + 0.001)
        timing = f"{_stamp(word.start_s, separator)} --> {_stamp(end, separator)}"
        cues.append(f"{n}\n{timing}\n{word.word}\n" if kind == "srt" else f"{timing}\n{word.word}\n")
    return ("WEBVTT\n\n" if kind == "vtt" else "") + "\n".join(cues)


def write_captions(words: list[WordTime], path: Path) -> Path:
    kind = path.suffix.lower().lstrip(".")
    if kind not in ("srt", "vtt"):
        raise UserError(f"--captions {path}: name a .srt or .vtt file")
    path.write_text(captions(words, kind))
    return path
