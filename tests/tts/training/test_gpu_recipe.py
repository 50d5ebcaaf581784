"""training/gpu.sh, the one command for a lent GPU: refused in one line without one, and its S5 path run on the CPU
with a tiny model of the paper config's family for two steps, leaving a checkpoint and an export to judge."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tts.paths import CONFIGS, REPO_ROOT

SCRIPT = REPO_ROOT / "training" / "gpu.sh"


def run(*args, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_without_a_gpu_it_says_so_in_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = run("s5")
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "training/gpu.sh: no CUDA GPU here (CPU=1 runs it anyway, slowly)"]
    assert run("nonsense", CPU="1").returncode == 2


@pytest.mark.slow
def test_the_s5_recipe_trains_a_tiny_model_of_the_paper_family_on_the_cpu(tmp_path):
    config = tmp_path / "tiny_paper.yaml"
    config.write_text(f"base: {CONFIGS / 's5_paper.yaml'}\nmodel: {{d_model: 32, n_heads: 2, encoder_layers: 1, "
                      "decoder_layers: 2, d_ffn: 64, aux_channels: 16, alignment_layers: [1]}\n"
                      "train: {batch_frames: 400, max_frames: 200, val_every: 1000, warmup_steps: 1}\n")
    out = tmp_path / "run"
    result = run("s5", CPU="1", CONFIG=str(config), OUT=str(out), MINUTES="2", MAX_STEPS="2")
    assert result.returncode == 0, result.stderr[-800:]
    assert (out / "export" / "model.safetensors").exists()
