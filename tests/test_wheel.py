"""The package as other people install it: a non-editable wheel in a fresh virtual environment speaks a sentence
and answers a chat turn from a folder far from the checkout (weights, configs and examples come with the wheel)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # builds a 50 MB wheel and loads the voice and the embedded LLM


def test_a_wheel_installed_elsewhere_speaks_and_chats(tmp_path):
    wheels, venv, elsewhere, source = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere", tmp_path / "src"
    # built from a copy: an in-tree build leaves build/ behind, whose stale modules a later wheel would carry
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "runs", "corpus", "*.egg-info",
                                                                 "replay_out", "__pycache__", "vocoder_gan", "tokens"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                            "-q", "-w", str(wheels)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert build.returncode == 0, build.stderr[-800:]
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies (torch and the rest) are the test environment's, reached through a .pth line; the project
    # itself is only the wheel's copy (the checkout's editable finder lives in a .pth this venv does not read)
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                              *map(str, wheels.glob("*.whl"))], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-800:]
    elsewhere.mkdir()
    where = subprocess.run([str(python), "-c", "import agent, tts.paths as p; print(agent.__file__); print(p.CONFIGS)"],
                           capture_output=True, text=True, cwd=elsewhere, check=True).stdout.split()
    assert where[0].startswith(site) and where[1] == str(venv / "share" / "s5-agent" / "configs")
    s5 = venv / "bin" / "s5"
    said = subprocess.run([str(s5), "say", "Hello from the wheel.", "--out", "hi.wav"], capture_output=True,
                          text=True, cwd=elsewhere, timeout=600, stdin=subprocess.DEVNULL)
    assert said.returncode == 0, said.stderr[-800:]
    assert (elsewhere / "hi.wav").stat().st_size > 20000
    chat = subprocess.run([str(s5), "chat", "--llm", "embedded", "--out", "chat"], input="Hi there.\n",
                          capture_output=True, text=True, cwd=elsewhere, timeout=600)
    assert chat.returncode == 0, chat.stderr[-800:]
    assert (elsewhere / "chat" / "turn_001.wav").exists()
