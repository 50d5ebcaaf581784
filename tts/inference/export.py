"""Release files of a model: fp16 `model.safetensors` and `model.json` (model config, symbol table, notes)."""
from __future__ import annotations

import json
from pathlib import Path

from audio_io.errors import UserError
from tts.frontend.g2p import SymbolTable
from tts.model.config import ModelConfig, from_dict
from tts.model.s5tts import S5TTS


# ---- checkpoints ------------------------------------------------------------------------------------------------
def export_weights(model: S5TTS, directory: Path, symbols: SymbolTable, extra: dict | None = None) -> None:
    """Release files: model.safetensors (fp16) + model.json (model config, symbol table, notes)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().half().contiguous() for k, v in model.state_dict().items()}
    save_file(state, directory / "model.safetensors")
    meta = {"model": model.config.to_dict(), "symbols": symbols.symbols, **(extra or {})}
    (directory / "model.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False))


def load_exported(directory: Path) -> tuple[S5TTS, SymbolTable, dict]:
    from safetensors.torch import load_file

    directory = Path(directory)
    if not (directory / "model.safetensors").exists():
        raise UserError(f"no model.safetensors in {directory}")
    meta = json.loads((directory / "model.json").read_text())
    model = S5TTS(from_dict(ModelConfig, meta["model"]))
    model.load_state_dict({k: v.float() for k, v in load_file(directory / "model.safetensors").items()})
    return model.eval(), SymbolTable(meta["symbols"]), meta
