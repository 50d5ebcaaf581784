"""The `s5` command as a user meets it: one-line errors, JSON where asked. Commands run in this process through
`main()` (each subprocess would import torch again); the chat runs as a real subprocess, as a user starts it."""
import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from tts.paths import EXAMPLES


def s5(*args: str, timeout: int = 600, cwd=None, subprocess_run: bool = False, typed: str | None = None
       ) -> subprocess.CompletedProcess:
    """`s5 ARGS`: its exit code, standard output and standard error (`typed`: the subprocess's standard input)."""
    if subprocess_run:
        return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True,
                              timeout=timeout, input=typed, stdin=None if typed is not None else subprocess.DEVNULL,
                              cwd=cwd)
    from agent.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd or os.getcwd()), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit:  # argparse's own errors
            code = exit.code
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


@pytest.mark.slow  # loads the embedded Gemma and both voices
def test_chat_answers_a_typed_line_and_exits_cleanly(tmp_path):
    """The README's first command as CI meets it: no sound card, one typed line, then end of input."""
    result = s5("chat", cwd=tmp_path, subprocess_run=True, typed="Hello! How are you today?\n")
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "llama_" not in result.stderr + result.stdout  # llama.cpp's own lines go to the log, not the screen
    out = tmp_path / "s5_chat_out"  # the turn's latency record (and, with no sound card, its WAV)
    [record] = [json.loads(line) for line in (out / "latency.jsonl").read_text().splitlines()]
    assert record["error"] is None and record["reply"] and record["spoken_words"] > 0 and record["audio_s"] > 0
    played_to_a_device = "turns are written to" not in result.stderr
    assert len(list(out.glob("*.wav"))) == (0 if played_to_a_device else 1)


@pytest.mark.parametrize(
    "args, message",
    [
        (("data", "build", "--hours", "0.01", "--out", "{tmp}/bad_voice", "--voices", "nope"), "unknown voices: nope"),
        (("bench", "model", "--config", "no_such_config"), "no config 'no_such_config'"),
        (("eval", "--model", "/nonexistent/model"), "no S5-TTS checkpoint"),
        (("bench", "paper", "--model", "extra=/nonexistent/model"), "no S5-TTS checkpoint"),  # before any model runs
        (("train", "--config", "s5_default", "--data", "/nonexistent/tokens", "--out", "{tmp}/bad_run"), "no training utterances"),
    ],
)
def test_bad_input_gives_one_clear_line(args, message, tmp_path):
    result = s5(*(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and message in result.stderr
    assert len([l for l in result.stderr.splitlines() if l.strip()]) <= 2


def test_more_bad_input_gives_one_clear_line(tmp_path):
    """A session count that is not a number, a clip that is not a WAV, a config that is not YAML or has a word
    where a number goes: one line each, naming what to fix."""
    (tmp_path / "clip.mp3").write_bytes(b"ID3\x03\x00 not a wav")
    (tmp_path / "broken.yaml").write_text("train:\n  lr: [1\n")
    (tmp_path / "words.yaml").write_text("train:\n  lr: fast\n")
    for args, message in [
        (("bench", "serve", "--sessions", "1,x"), "--sessions 1,x"),
        (("bench", "serve", "--renders", "thread,gpu"), "--renders gpu: each one of inline, inline-batched"),
        (("bench", "serve", "--renders", "inline,thread", "--url", "http://127.0.0.1:9,http://127.0.0.1:10"),
         "either several --url or several --renders"),
        (("say", "hi", "--out", str(tmp_path / "o.wav"), "--prompt-wav", str(tmp_path / "clip.mp3"), "--prompt-text", "hi"),
         "not a 16-bit WAV file"),
        (("train", "--config", str(tmp_path / "broken.yaml")), "not valid YAML"),
        (("train", "--config", str(tmp_path / "words.yaml")), "train: lr = 'fast'"),
        (("codec", "campaign", "--judge", str(tmp_path / "step_x")), "not a step_<N> vocoder snapshot"),
        (("codec", "campaign", "--snapshots-to", str(tmp_path / "out"), "--snapshots", "0"), "--snapshots must be 1"),
        (("codec", "campaign", "--device", "gpu"), "unknown torch device 'gpu'"),
    ]:
        result = s5(*args)
        assert result.returncode == 2 and "Traceback" not in result.stderr and message in result.stderr, result.stderr[-400:]
        assert len([l for l in result.stderr.splitlines() if l.strip()]) <= 2


def test_a_gpu_recipe_on_a_machine_without_one_is_one_line(tmp_path):
    """The GPU recipe names cuda: where there is none it is refused before a corpus is built or weights load."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    result = s5("codec", "campaign", "--config", "configs/vocoder_gan_gpu.yaml", "--snapshots-to", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr and "no CUDA GPU" in result.stderr, result.stderr[-400:]
    assert not (tmp_path / "out").exists()


def test_bench_codec_runs_without_a_corpus(tmp_path):
    """A README command on a fresh clone (no corpus/): the Piper voice speaks the unseen replies instead, said so."""
    result = s5("bench", "codec", "--no-quality", "--limit", "2", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-500:]
    assert json.loads(result.stdout)["n"] == 2 and "no corpus here" in result.stderr


def test_bench_codec_compares_vocoders_on_one_speaking(tmp_path):
    """Several --vocoder: the clips are spoken once and voiced through each, one result line per vocoder."""
    result = s5("bench", "codec", "--no-quality", "--limit", "1", "--json", "--vocoder", "fast", "universal", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-500:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert [line["vocoder"] for line in lines] == ["fast", "universal"] and all(line["n"] == 1 for line in lines)
    assert result.stderr.count("no corpus here") == 1  # spoken once


def test_numbers_in_configs_are_numbers(tmp_path):
    """YAML reads `1e-3` as a string; every config loader reads it as the number it is."""
    from tts.training.trainer import load_train_config

    (tmp_path / "run.yaml").write_text("model:\n  d_model: 64\ntrain:\n  lr: 1e-3\n  max_steps: 2e3\n")
    model, train = load_train_config(tmp_path / "run.yaml")
    assert train.lr == 0.001 and isinstance(train.lr, float) and train.max_steps == 2000 and isinstance(train.max_steps, int)


@pytest.mark.slow
def test_bench_model_json():
    result = s5("bench", "model", "--json", "--frames", "40")
    assert result.returncode == 0, result.stderr[-500:]
    data = json.loads(result.stdout)
    for key in ("params_paper", "params_default", "train_step_s_default", "ms_per_frame_cached", "ms_per_frame_naive", "cached_speedup"):
        assert key in data
    assert 150e6 <= data["params_paper"] <= 170e6 and data["cached_vs_naive_max_abs_diff"] < 1e-3


@pytest.mark.slow
def test_replay_of_several_scripts_gathers_one_table_and_names_the_one_that_fails(tmp_path):
    """Without --ray, as with it (tests/agent/test_replay_ray.py): one process, the voices loaded once."""
    broken = tmp_path / "broken.yaml"
    broken.write_text("turns: []\n")
    result = s5("replay", str(EXAMPLES / "short_answers.yaml"), str(broken), "--json", "--no-wavs",
                "--out", str(tmp_path / "out"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    rows = {row["script"]: row for row in json.loads(result.stdout.strip().splitlines()[-1])["scripts"]}
    assert rows["short answers"]["turns"] == 3 and rows["short answers"]["failed"] is None
    assert "non-empty `turns:`" in rows["broken"]["failed"] and rows["all"]["turns"] == 3
    lines = (tmp_path / "out" / "latency.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["script"] == "short answers" for line in lines)
