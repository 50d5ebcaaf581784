"""The repository stays lean: a tracked file over 5 MB must be a shipped weight (or the vocoder campaign's one
snapshot folder, overwritten by each run), and `tts/assets/` holds only what the installed program loads."""
from __future__ import annotations

import fnmatch
import shutil
import subprocess

import pytest

from tts.paths import REPO_ROOT

LIMIT_BYTES = 5 * 1024 * 1024
LARGE_FILES_ALLOWED = (
    "tts/assets/models/*/model.safetensors",  # the shipped S5 / T5 checkpoints
    "tts/assets/mel_codec/codec.safetensors",  # the shipped codec
    "tts/assets/vocoder/vocoder.safetensors",  # the shipped iSTFT vocoder
    "training/vocoder_campaign/*/*.safetensors",  # the campaign's fp16 snapshot, one folder, no optimizer state
)
RUNTIME_ASSETS = ("tts/assets/models/*", "tts/assets/mel_codec/*", "tts/assets/vocoder/*")  # pyproject package data


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (REPO_ROOT / name).is_file()]


def large_unlisted(files: list[str], size_of) -> list[str]:
    return [name for name in files if size_of(name) > LIMIT_BYTES
            and not any(fnmatch.fnmatch(name, pattern) for pattern in LARGE_FILES_ALLOWED)]


def test_no_large_tracked_file_outside_the_shipped_weights():
    assert large_unlisted(tracked_files(), lambda name: (REPO_ROOT / name).stat().st_size) == []


def test_the_size_rule_catches_a_new_large_file():
    sizes = {"tts/assets/models/s5_default/model.safetensors": 16 << 20, "runs/x/train_state.pt": 40 << 20,
             "tts/assets/vocoder_gan/latest/discriminators.safetensors": 6 << 20, "README.md": 4000}
    assert large_unlisted(list(sizes), sizes.get) == ["runs/x/train_state.pt",
                                                      "tts/assets/vocoder_gan/latest/discriminators.safetensors"]


def test_runtime_assets_are_only_what_the_program_loads():
    assets = [name for name in tracked_files() if name.startswith("tts/assets/")]
    strays = [name for name in assets if not any(fnmatch.fnmatch(name, p) for p in RUNTIME_ASSETS)]
    assert strays == [], "training state belongs under training/, not in the runtime package"


def test_the_readme_fits_a_screen_or_two():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 120
    assert [n for n, line in enumerate(lines, 1) if len(line) > 200] == []
