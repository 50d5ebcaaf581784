"""Which codec a folder holds: `codec.json`'s `kind` ("mel": the FSQ mel codec + HiFi-GAN; none: the WORLD-feature
codec) picks the class. Models name their codec folder in their export (`train.codec_dir`)."""
from __future__ import annotations

import json
from pathlib import Path

from tts.codec.mel_codec import MelCodec
from tts.codec.world_codec import DEFAULT_CODEC_DIR, BuiltinCodec
from tts.errors import UserError
from tts.paths import repo_path

Codec = BuiltinCodec | MelCodec


def resolve_codec_dir(directory: Path | str | None) -> Path:
    """None or "" -> the shipped default; a relative path that does not exist from here is taken from the repo root
    (exports name their codec as `tts/assets/...`)."""
    if not directory:
        return DEFAULT_CODEC_DIR
    return repo_path(directory)


def load_codec(directory: Path | str | None = None) -> Codec:
    directory = resolve_codec_dir(directory)
    config = directory / "codec.json"
    if not config.exists():
        raise UserError(f"no codec in {directory} (codec.json missing)")
    kind = json.loads(config.read_text()).get("kind", "world")
    if kind == "mel":
        return MelCodec.load(directory)
    if kind == "world":
        return BuiltinCodec.load(directory)
    raise UserError(f"{config}: unknown codec kind {kind!r} (mel or world)")
