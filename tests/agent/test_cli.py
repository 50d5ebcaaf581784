"""The `s5` command as a user meets it: real subprocesses, one-line errors, JSON where asked."""
import json
import subprocess
import sys

import pytest


def s5(*args: str, timeout: int = 600, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=cwd)


@pytest.mark.slow  # loads the embedded Gemma and both voices
def test_chat_runs_and_exits_cleanly(tmp_path):
    result = s5("chat", cwd=tmp_path)  # no sound card and no input: WAVs under ./s5_chat_out, then a clean exit
    assert result.returncode == 0 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (("data", "build", "--hours", "0.01", "--out", "/tmp/s5_bad_voice", "--voices", "nope"), "unknown voices: nope"),
        (("bench", "model", "--config", "no_such_config"), "no config 'no_such_config'"),
        (("eval", "--model", "/nonexistent/model"), "no S5-TTS checkpoint"),
        (("train", "--config", "s5_default", "--data", "/nonexistent/tokens", "--out", "/tmp/s5_bad_run"), "no training utterances"),
    ],
)
def test_bad_input_gives_one_clear_line(args, message):
    result = s5(*args)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and message in result.stderr
    assert len([l for l in result.stderr.splitlines() if l.strip()]) <= 2


@pytest.mark.slow
def test_bench_model_json():
    result = s5("bench", "model", "--json", "--frames", "40")
    assert result.returncode == 0, result.stderr[-500:]
    data = json.loads(result.stdout)
    for key in ("params_paper", "params_default", "train_step_s_default", "ms_per_frame_cached", "ms_per_frame_naive", "cached_speedup"):
        assert key in data
    assert 150e6 <= data["params_paper"] <= 170e6 and data["cached_vs_naive_max_abs_diff"] < 1e-3
