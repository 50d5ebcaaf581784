"""Which codec a folder holds: `codec.json`'s `kind` picks the class: "mel" (the FSQ mel codec + its vocoder) or
"nemo" (`"model"`: a `.nemo` file or a pretrained name already on this machine; needs the nemo extra). Models name
their codec folder in their export (`train.codec_dir`)."""
from __future__ import annotations

import json
from pathlib import Path

from audio_io.errors import UserError
from tts.codec.base import Codec
from tts.codec.mel_codec import MelCodec
from tts.paths import ASSETS, repo_path

__all__ = ["Codec", "load_codec", "resolve_codec_dir"]

DEFAULT_CODEC_DIR = ASSETS / "mel_codec"


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
    spec = json.loads(config.read_text())
    kind = spec.get("kind")
    if kind == "mel":
        return MelCodec.load(directory)
    if kind == "nemo":
        from tts.codec.nemo import NemoCodec

        if not spec.get("model"):
            raise UserError(f"{config}: a nemo codec names its model (a .nemo file or a pretrained name)")
        model = Path(spec["model"])
        return NemoCodec.load(directory / model if model.suffix == ".nemo" and not model.is_absolute() else spec["model"])
    raise UserError(f"{config}: unknown codec kind {kind!r} (\"kind\": \"mel\" or \"nemo\")")
