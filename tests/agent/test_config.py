"""The typed agent config: defaults in one place, unknown keys and wrong types refused with the key named."""
import argparse

import pytest
import yaml

from agent.cli import main
from agent.config import DEFAULT_AGENT_CONFIG, AgentSettings, ConfigError
from agent.settings import resolve


def settings_from(path):
    return resolve("chat", argparse.Namespace(config=path), environ={}).settings


def test_shipped_config_sets_nothing_so_the_defaults_are_written_once():
    """configs/agent.yaml documents every key, all commented out: what a command uses without --config is the
    default from agent/config.py (`--show-settings` says `# default` for each)."""
    assert DEFAULT_AGENT_CONFIG.exists() and not yaml.safe_load(DEFAULT_AGENT_CONFIG.read_text())
    resolved = resolve("chat", argparse.Namespace(config=None), environ={})
    assert resolved.settings == AgentSettings() and set(resolved.origins.values()) == {"default"}


@pytest.mark.parametrize("text,named", [
    ("llm:\n  keepalive: 5m\n", "llm.keepalive"),
    ("histroy_turns: 3\n", "histroy_turns"),
    ("tts:\n  top_k: many\n", "tts.top_k"),
    ("tts:\n  mode: s6\n", "tts.mode"),
    ("audio: loud\n", "audio"),
    ("audio:\n  voice: sometimes\n", "audio.voice"),
    ("history_turns: true\n", "history_turns"),  # a bool is not an int
    ("tts:\n  max_stretch: 3\n", "tts.max_stretch"),
    ("tts:\n  emit_every: 0\n", "tts.emit_every"),
])
def test_bad_keys_are_named(tmp_path, text, named):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        settings_from(path)


def test_missing_keys_take_defaults_and_ints_pass_for_floats(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("tts:\n  temperature: 1\nllm:\n  keep_alive: 5m\n")
    settings = settings_from(path)
    assert settings.tts.temperature == 1.0 and isinstance(settings.tts.temperature, float)
    assert settings.llm.keep_alive == "5m" and settings.tts.top_k == AgentSettings().tts.top_k


def test_chat_with_an_unknown_key_fails_in_one_line(tmp_path, capsys):
    path = tmp_path / "agent.yaml"
    path.write_text("tts:\n  voice: joe\n")
    assert main(["chat", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tts.voice" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
