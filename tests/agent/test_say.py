"""`s5 say` and `s5 bench tts` as a user runs them, on tiny random checkpoints (the plumbing, not the voice)."""
import json

import numpy as np
import pytest
import torch

from audio_io.wav import read_wav
from tests.agent.test_cli import s5
from tests.conftest import tiny_config
from tts.frontend.g2p import SymbolTable
from tts.inference.export import export_weights
from tts.model.s5tts import S5TTS


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    for name, k in (("s5_default", 2), ("t5_default", None)):
        torch.manual_seed(0)
        config = tiny_config(k, phoneme_vocab_size=len(SymbolTable.default()), num_codebooks=8, codebook_size=1000)
        export_weights(S5TTS(config), root / name, SymbolTable.default())
    return root


@pytest.mark.parametrize("mode", ["s5", "t5", "sentence"])
def test_say_writes_a_wav(models, tmp_path, mode):
    out = tmp_path / f"{mode}.wav"
    model = models / ("s5_default" if mode == "s5" else "t5_default")
    result = s5("say", "Hello there. Nice to meet you!", "--mode", mode, "--model", str(model), "--out", str(out), "--seed", "1")
    assert result.returncode == 0, result.stderr[-800:]
    audio, rate = read_wav(out)
    assert rate == 22050 and len(audio) > 0
    assert f"{mode}: 6 words" in result.stderr and "first audible" in result.stderr


def test_say_prints_word_times_and_writes_captions(models, tmp_path):
    """`--json`: one object whose words span the WAV, back to back; `--captions`: one SRT cue per word."""
    out, srt = tmp_path / "hi.wav", tmp_path / "hi.srt"
    result = s5("say", "Hello there, nice to meet you.", "--model", str(models / "s5_default"), "--out", str(out),
                "--seed", "1", "--json", "--captions", str(srt))
    assert result.returncode == 0, result.stderr[-800:]
    data = json.loads(result.stdout)
    audio, rate = read_wav(out)
    assert [w["word"] for w in data["words"]] == ["Hello", "there,", "nice", "to", "meet", "you."]
    assert data["words"][0]["start_s"] == 0 and abs(data["words"][-1]["end_s"] - len(audio) / rate) < 0.05
    cues = srt.read_text().strip().split("\n\n")
    assert len(cues) == 6 and cues[0].splitlines()[2] == "Hello" and " --> " in cues[0].splitlines()[1]
    bad = s5("say", "Hi.", "--model", str(models / "s5_default"), "--out", str(out), "--captions", str(tmp_path / "x.txt"))
    assert bad.returncode == 2 and "name a .srt or .vtt file" in bad.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (("say", "   ", "--out", "{tmp}/x.wav"), "nothing to say"),
        (("say", "*** --- ***", "--out", "{tmp}/x.wav"), "nothing to say"),
        (("say", "hello", "--model", "/nonexistent"), "no S5-TTS checkpoint"),
        (("say", "hello", "--mode", "loud"), "invalid choice"),
    ],
)
def test_say_bad_input_gives_one_line(args, message, tmp_path):
    result = s5(*(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == 2 and "Traceback" not in result.stderr and message in result.stderr


def test_say_refuses_s5_mode_on_a_full_context_model(models, tmp_path):
    result = s5("say", "hello", "--model", str(models / "t5_default"), "--out", str(tmp_path / "x.wav"))
    assert result.returncode == 2 and "needs an S5 checkpoint" in result.stderr


@pytest.mark.slow
def test_bench_tts_json(models, tmp_path):
    sentences = tmp_path / "s.txt"
    sentences.write_text("Hello there, nice to meet you.\nThis is a test. It has two sentences.\n")
    result = s5("bench", "tts", "--json", "--words-per-second", "12", "--sentences", str(sentences),
                "--s5-model", str(models / "s5_default"), "--t5-model", str(models / "t5_default"))
    assert result.returncode == 0, result.stderr[-800:]
    data = json.loads(result.stdout)
    for mode in ("s5", "t5", "sentence"):
        for key in ("first_chunk_ms_p50", "first_chunk_ms_p95", "first_audible_ms_p50", "first_audible_ms_p95",
                    "rtf", "underruns", "underrun_ms", "frames_per_word"):
            assert key in data[mode]
        assert data[mode]["n"] == 2
    assert "ratio_first_audible_s5_over_t5" in data
    comparison = data["s5_streaming_vs_offline"]
    assert comparison["identical_codes"] is True
    assert 0.99 <= comparison["duration_ratio_min"] <= comparison["duration_ratio_max"] <= 1.01


def test_replay_writes_one_wav_per_turn_and_the_records(models, tmp_path):
    out = tmp_path / "replay"
    result = s5_with_models(models, "replay", "examples/short_answers.yaml", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr[-800:]
    data = json.loads(result.stdout)
    assert len(data["wavs"]) == 3 and all(read_wav(w)[0].size > 0 for w in data["wavs"])
    lines = (out / "latency.jsonl").read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(l)["e2e_chunk_ms"] is not None for l in lines)


def test_a_replay_scripts_an_interruption(models):
    """`interrupt_after_s`: the second reply is cut after its first sound; its record says how many of its words
    were heard, and the conversation goes on."""
    result = s5_with_models(models, "replay", "examples/interrupted.yaml", "--no-wavs", "--json")
    assert result.returncode == 0, result.stderr[-800:]
    first, cut, third = json.loads(result.stdout)["records"]
    assert not first["cancelled"] and first["words_heard"] == first["words_written"] > 0
    assert cut["cancelled"] and 0 < cut["words_heard"] < cut["words_written"]
    assert third["error"] is None and not third["cancelled"]


def test_replay_of_hostile_text_completes_every_turn(models):
    """Notation, a code block, a 45-letter word, only emoji, other scripts, control characters: every turn of
    the example ends without an error; the emoji-only one says nothing, the others say their English words."""
    result = s5_with_models(models, "replay", "examples/hostile_text.yaml", "--no-wavs", "--json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-800:]
    records = json.loads(result.stdout)["records"]
    assert len(records) == 8 and all(r["error"] is None and not r["cancelled"] for r in records)
    assert [r["spoken_words"] > 0 for r in records] == [True, True, True, False, True, True, True, True]
    assert "dropped unspeakable character" in result.stderr


@pytest.mark.slow
def assert_a_drawn_png(path, min_width: int = 600, min_height: int = 350) -> None:
    """A PNG of at least this size whose pixels are not one flat colour."""
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    assert pixels.shape[1] >= min_width and pixels.shape[0] >= min_height
    assert pixels[..., :3].std() > 0.05 and (pixels[..., :3] < 0.5).mean() > 0.005  # lines and text, not blank


def test_bench_e2e_json(models, tmp_path):
    result = s5("bench", "e2e", "--json", "--script", "examples/short_answers.yaml", "--first-token-ms", "50",
                "--tokens-per-second", "200", "--s5-model", str(models / "s5_default"), "--t5-model", str(models / "t5_default"),
                "--plot", str(tmp_path / "e2e.png"))
    assert result.returncode == 0, result.stderr[-800:]
    assert_a_drawn_png(tmp_path / "e2e.png")
    data = json.loads(result.stdout)
    for mode in ("s5", "t5", "sentence"):
        assert data[mode]["turns"] == 3 and "e2e_p50_ms" in data[mode] and "underruns" in data[mode]
    assert data["ratio_e2e_s5_over_t5"] > 0


def s5_with_models(models, *args):
    """Run `s5` with the default checkpoints replaced by the tiny test ones (S5_MODELS_DIR)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "S5_MODELS_DIR": str(models)}
    return subprocess.run([sys.executable, "-m", "agent.cli", *args], capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, env=env)


@pytest.fixture()
def ollama_server():
    """The Ollama stand-in on a background event loop, for commands run as subprocesses."""
    import asyncio
    import threading

    from tests.ollama_standin import free_port, start

    port = free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve():
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(start(port))
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_chat_with_typed_turns_writes_wavs_and_one_latency_line_per_turn(models, tmp_path, ollama_server):
    import os
    import subprocess
    import sys

    # the server is named by OLLAMA_HOST alone: it beats the host the shipped configs/agent.yaml names
    env = {**os.environ, "S5_MODELS_DIR": str(models), "OLLAMA_HOST": ollama_server}
    result = subprocess.run([sys.executable, "-m", "agent.cli", "chat", "--llm", "ollama",
                             "--out", str(tmp_path)], input="What is the capital of France?\nAnd again?\n",
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-800:]
    assert "LLM: Ollama llama3.3:70b" in result.stderr
    lines = [l for l in result.stdout.splitlines() if l.startswith("turn ")]
    assert len(lines) == 2 and all("E2E" in l and "first token" in l for l in lines)
    assert "Sure, the capital of France is Paris." in result.stdout
    assert sorted(p.name for p in tmp_path.glob("turn_*.wav")) == ["turn_001.wav", "turn_002.wav"]
    assert len((tmp_path / "latency.jsonl").read_text().splitlines()) == 2


def test_chat_with_ollama_down_says_so_in_one_line(models, tmp_path, ollama_server):
    """The flag names a port nothing listens on; OLLAMA_HOST names a live server: the flag wins."""
    import os
    import subprocess
    import sys

    from tests.ollama_standin import free_port

    env = {**os.environ, "S5_MODELS_DIR": str(models), "OLLAMA_HOST": ollama_server}
    result = subprocess.run([sys.executable, "-m", "agent.cli", "chat", "--llm", "ollama", "--ollama-host",
                             f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path)], input="hi\n",
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cannot reach Ollama" in result.stderr and "ollama serve" in result.stderr


def test_say_with_a_voice_prompt(models, tmp_path):
    """A reference clip and its transcript steer the voice: the same text and seed sound different with it."""
    out = tmp_path / "prompted.wav"
    result = s5("say", "Nice to meet you.", "--model", str(models / "s5_default"), "--out", str(out), "--seed", "2",
                "--prompt-wav", "tests/data/piper_fox.wav", "--prompt-text", "The quick brown fox jumps over the lazy dog.")
    assert result.returncode == 0, result.stderr[-800:]
    plain = tmp_path / "plain.wav"
    assert s5("say", "Nice to meet you.", "--model", str(models / "s5_default"), "--out", str(plain),
              "--seed", "2").returncode == 0
    prompted_audio, rate = read_wav(out)
    plain_audio, _ = read_wav(plain)
    assert 0.4 < len(prompted_audio) / rate < 6  # four words, spoken: not empty, not a runaway
    assert len(prompted_audio) != len(plain_audio) or not np.allclose(prompted_audio, plain_audio)  # the prompt shaped it
    missing = s5("say", "hi", "--model", str(models / "s5_default"), "--out", str(out), "--prompt-wav", "tests/data/piper_fox.wav")
    assert missing.returncode == 2 and "needs --prompt-text" in missing.stderr


def test_ctrl_c_at_the_chat_prompt_quits_at_once(models, tmp_path, ollama_server):
    """`s5 chat` on a terminal (a pseudo-terminal here): SIGINT at the prompt ends it within 2 seconds."""
    import os
    import pty
    import select
    import signal
    import subprocess
    import sys
    import time

    leader, follower = pty.openpty()
    env = {**os.environ, "S5_MODELS_DIR": str(models), "OLLAMA_HOST": ollama_server}
    chat = subprocess.Popen([sys.executable, "-m", "agent.cli", "chat", "--llm", "ollama", "--out", str(tmp_path)],
                            stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    seen, deadline = b"", time.monotonic() + 300
    try:
        while b"type a message" not in seen and time.monotonic() < deadline and chat.poll() is None:
            if select.select([leader], [], [], 1.0)[0]:
                seen += os.read(leader, 4096)
        assert b"type a message" in seen, seen[-500:]
        time.sleep(0.5)  # at the prompt, reading the terminal
        chat.send_signal(signal.SIGINT)
        sent = time.monotonic()
        while chat.poll() is None and time.monotonic() - sent < 10:
            if select.select([leader], [], [], 0.1)[0]:
                try:
                    os.read(leader, 4096)
                except OSError:
                    break
        assert chat.wait(timeout=10) == 0  # it hung for good while the stdin reader was joined at exit
    finally:
        if chat.poll() is None:
            chat.kill()
        os.close(leader)


def test_chat_with_an_openai_compatible_server(models, tmp_path):
    """`s5 chat --llm openai` talks to llama-cpp-python's server (a real OpenAI-compatible one) in one turn."""
    import os
    import subprocess
    import sys

    pytest.importorskip("llama_cpp.server")
    from tests.llama_server import start_server

    config = tmp_path / "agent.yaml"
    config.write_text("llm:\n  max_tokens: 40\n")  # a base model may run on to the end of its context
    server, url = start_server(n_ctx=512)
    try:
        env = {**os.environ, "S5_MODELS_DIR": str(models)}
        result = subprocess.run([sys.executable, "-m", "agent.cli", "chat", "--llm", "openai", "--llm-url", url,
                                 "--llm-model", "gemma", "--config", str(config), "--out", str(tmp_path)],
                                input="Say hello.\n",
                                capture_output=True, text=True, timeout=600, env=env)
    finally:
        server.terminate()
        server.wait(10)
    assert result.returncode == 0, result.stderr[-800:]
    assert f"LLM: gemma at {url}" in result.stderr
    lines = [l for l in result.stdout.splitlines() if l.startswith("turn ")]
    assert len(lines) == 1 and "E2E" in lines[0]
    assert (tmp_path / "turn_001.wav").exists()


def test_bench_e2e_behind_an_openai_compatible_server(models, tmp_path):
    """`s5 bench e2e --llm openai`: the script's user line goes to llama-cpp-python's server in every mode."""
    pytest.importorskip("llama_cpp.server")
    from tests.llama_server import start_server

    script = tmp_path / "one.yaml"
    script.write_text("name: one\nllm: {first_token_ms: 50, tokens_per_second: 100}\nturns:\n"
                      "  - user: Say hello.\n    assistant: Hello.\n")
    config = tmp_path / "agent.yaml"
    config.write_text("llm:\n  max_tokens: 40\n")  # a base model may run on to the end of its context
    server, url = start_server(n_ctx=512)
    try:
        result = s5_with_models(models, "bench", "e2e", "--json", "--script", str(script), "--llm", "openai",
                                "--llm-url", url, "--llm-model", "gemma", "--config", str(config))
    finally:
        server.terminate()
        server.wait(10)
    assert result.returncode == 0, result.stderr[-800:]
    data = json.loads(result.stdout)
    assert data["llm"] == "openai"
    for mode in ("s5", "t5", "sentence"):
        assert data[mode]["turns"] == 1 and data[mode]["errors"] == 0 and data[mode]["e2e_p50_ms"]


def test_say_plot_draws_the_attention_and_the_waveform(models, tmp_path):
    result = s5_with_models(models, "say", "Hello there, my good friend.", "--out", str(tmp_path / "a.wav"),
                            "--plot", str(tmp_path / "attention.png"), "--seed", "1")
    assert result.returncode == 0, result.stderr[-800:]
    assert_a_drawn_png(tmp_path / "attention.png")


def test_replay_with_a_live_llm_finds_ollama_through_OLLAMA_HOST(models, tmp_path, ollama_server):
    """`s5 replay --llm ollama` with the shipped config: the script's user lines go to the server OLLAMA_HOST names."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "S5_MODELS_DIR": str(models), "OLLAMA_HOST": ollama_server}
    result = subprocess.run([sys.executable, "-m", "agent.cli", "replay", "examples/short_answers.yaml", "--llm", "ollama",
                             "--out", str(tmp_path), "--no-wavs", "--json"], capture_output=True, text=True, timeout=600,
                            env=env, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-800:]
    records = json.loads(result.stdout)["records"]
    assert len(records) == 3 and all(r["llm"].startswith("ollama") and "Paris" in r["reply"] for r in records)
