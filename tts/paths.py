"""Where the project's files are: exports and codec configs name assets relative to the repository root.

In a checkout (editable install) that is the repository. From a wheel, the packages sit in site-packages with the
shipped weights as package data (`tts/assets/...`, so the same relative names resolve there), and `configs/` and
`examples/` are installed as data under `<prefix>/share/s5-agent/` (pyproject.toml)."""
from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS = REPO_ROOT / "tts" / "assets"
SHARED = Path(sys.prefix) / "share" / "s5-agent"


def _project_folder(name: str) -> Path:
    checkout = REPO_ROOT / name
    return checkout if checkout.is_dir() or not (SHARED / name).is_dir() else SHARED / name


CONFIGS = _project_folder("configs")
EXAMPLES = _project_folder("examples")


def repo_path(path: Path | str) -> Path:
    """A path as given if it exists (or is absolute), else the same path from the repository root."""
    path = Path(path)
    return path if path.is_absolute() or path.exists() else REPO_ROOT / path
DEFAULT_TOKENS = "training/tokens/piper_joe_mel21"  # the shipped tokenised corpus (train/val/test shards)
