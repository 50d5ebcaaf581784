"""Where the repository's files are: exports and codec configs name assets relative to the repository root."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS = REPO_ROOT / "tts" / "assets"
CONFIGS = REPO_ROOT / "configs"


def repo_path(path: Path | str) -> Path:
    """A path as given if it exists (or is absolute), else the same path from the repository root."""
    path = Path(path)
    return path if path.is_absolute() or path.exists() else REPO_ROOT / path
DEFAULT_TOKENS = "tts/assets/tokens/piper_joe_mel21"  # the shipped tokenised corpus (train/val/test shards)
