"""One settings path: every command resolves each key it reads from a flag, then the environment, then the --config
file, then the default; `--show-settings` prints what the command would use and where each value came from.

Table-driven: each key each command reads, set through each source, read back through the command's own entry
point (`s5 COMMAND ... --show-settings`), so a command that parsed a flag its own way would fail here."""
from __future__ import annotations

import pytest
import yaml

from agent.cli import main
from agent.config import AgentSettings
from agent.settings import COMMAND_DEFAULTS, COMMANDS, ENVIRONMENT, FLAGS, SECRET, command_keys, get_setting, option_of

ARGV = {  # how each command is started (its positional arguments, never read before the settings)
    "chat": ["chat"], "replay": ["replay", "script.yaml"], "say": ["say", "Hello there."], "serve": ["serve"],
    "eval": ["eval"], "bench e2e": ["bench", "e2e"], "bench tts": ["bench", "tts"], "bench voice": ["bench", "voice"],
    "bench serve": ["bench", "serve"], "bench paper": ["bench", "paper"],
    "bench words": ["bench", "words"], "wyoming": ["wyoming"],
}
VALUES = {  # a value other than every default, for each key
    "llm.backend": "openai", "llm.ollama_host": "http://ollama-box:11434", "llm.ollama_model": "qwen3:8b",
    "llm.keep_alive": "5m", "llm.openai_url": "http://gpu-box:8000/v1", "llm.openai_model": "llama-70b",
    "llm.openai_api_key": "sk-test", "llm.max_tokens": 99,
    "tts.mode": "t5", "tts.emit_every": 5, "tts.top_k": 7, "tts.temperature": 0.7, "tts.max_stretch": 1.5,
    "tts.cfg_scale": 2.0, "tts.vocoder": "universal",
    "audio.output": "null", "audio.device": "speakers", "audio.voice": True, "audio.input_device": "mic",
    "audio.end_silence_ms": 450.0, "audio.barge_in": False, "audio.echo_coupling_db": -12.0,
    "audio.echo_margin_db": 9.0, "history_turns": 3, "system_prompt": "Answer in one word.",
}
OTHER = {"llm.backend": "embedded", "tts.mode": "sentence", "tts.vocoder": "fast", "audio.output": "wav"}


def nested(key: str, value) -> dict:
    *parents, last = key.split(".")
    out = {last: value}
    for part in reversed(parents):
        out = {part: out}
    return out


def shown(capsys, argv: list[str]) -> dict[str, tuple[object, str]]:
    """key -> (value, origin) as `--show-settings` printed them."""
    assert main(argv + ["--show-settings"]) == 0
    out = {}
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("#"):
            continue
        text, _, comment = line.partition("  # ")
        key, value = next(iter(yaml.safe_load(text).items()))
        out[key] = (value, comment.split(";")[0])
    return out


def flag_args(command: str, key: str, value) -> list[str]:
    option = option_of(command, key)
    return [option] if FLAGS[key].kind is bool else [option, str(value)]


CASES = [(command, key) for command in COMMANDS for key in command_keys(command)]


@pytest.fixture(autouse=True)
def no_settings_environment(monkeypatch, tmp_path):
    for variable in ENVIRONMENT.values():
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no vocoder timings: nothing is loaded


@pytest.mark.parametrize("command, key", CASES, ids=[f"{c}:{k}" for c, k in CASES])
def test_each_key_through_each_source(command, key, capsys, monkeypatch, tmp_path):
    value = VALUES[key]
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump(nested(key, value)))
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    argv = ARGV[command]

    def check(result, expected, origin):
        got, where = result[key]
        assert where == origin
        if key in SECRET:
            assert got == ("(set)" if expected else None)
        else:
            assert got == expected

    default = COMMAND_DEFAULTS.get(command, {}).get(key, get_setting(AgentSettings(), key))
    check(shown(capsys, argv + ["--config", str(empty)]), default, "default")
    check(shown(capsys, argv + ["--config", str(config)]), value, "config")
    if key in ENVIRONMENT:
        monkeypatch.setenv(ENVIRONMENT[key], str(value))
        check(shown(capsys, argv + ["--config", str(config)]), value, "env")
        config.write_text(yaml.safe_dump(nested(key, "http://from-the-file:1")))
        check(shown(capsys, argv + ["--config", str(config)]), value, "env")  # the environment beats the file
    if key in FLAGS:
        other = OTHER.get(key, value)
        config.write_text(yaml.safe_dump(nested(key, other)) if other != value else "")
        check(shown(capsys, argv + ["--config", str(config)] + flag_args(command, key, value)), value, "flag")


def test_a_key_a_command_does_not_read_has_no_flag_there(capsys):
    with pytest.raises(SystemExit):
        main(["say", "Hello.", "--llm", "openai"])
    assert "unrecognized arguments: --llm" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("tts: {vocodr: fast}\n", "unknown key tts.vocodr"),
    ("tts: {top_k: many}\n", "tts.top_k = 'many' is not a"),
    ("llm: {backend: gpt}\n", "llm.backend 'gpt' is not one of"),
])
def test_a_bad_file_is_one_line(text, message, capsys, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    assert main(["chat", "--config", str(config), "--show-settings"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_show_settings_names_what_auto_chose_from_this_machines_timings(capsys, tmp_path):
    from tts.codec.vocoder_choice import VocoderTiming, write_cached

    timings = [VocoderTiming("universal", 4, 0.030, 0.012, 0.20), VocoderTiming("fast", 2, 0.004, 0.002, 0.03)]
    write_cached(timings, step_s=0.006, frame_rate=21.5)
    out = shown(capsys, ["say", "Hi."])
    assert out["tts.vocoder"][0] == "auto"
    assert main(["say", "Hi.", "--show-settings"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("tts.vocoder"))
    assert "auto -> universal" in line and "first sound" in line
