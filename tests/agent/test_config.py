"""The typed agent config: defaults in one place, unknown keys and wrong types refused with the key named."""
import pytest

from agent.cli import main
from agent.config import (
    DEFAULT_AGENT_CONFIG,
    AgentSettings,
    ConfigError,
    load_agent_settings,
)
from llm.ollama_backend import DEFAULT_HOST


def test_shipped_config_loads_and_matches_the_defaults():
    settings = load_agent_settings()
    assert settings.tts.mode == "s5" and settings.llm.backend == "auto" and settings.history_turns == 8
    assert settings.system_prompt == AgentSettings().system_prompt  # one default, written once
    assert DEFAULT_AGENT_CONFIG.exists()


@pytest.mark.parametrize("text,named", [
    ("llm:\n  keepalive: 5m\n", "llm.keepalive"),
    ("histroy_turns: 3\n", "histroy_turns"),
    ("tts:\n  top_k: many\n", "tts.top_k"),
    ("tts:\n  mode: s6\n", "tts.mode"),
    ("audio: loud\n", "audio"),
    ("audio:\n  voice: sometimes\n", "audio.voice"),
    ("history_turns: true\n", "history_turns"),  # a bool is not an int
])
def test_bad_keys_are_named(tmp_path, text, named):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_agent_settings(path)


def test_missing_keys_take_defaults_and_ints_pass_for_floats(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("tts:\n  temperature: 1\nllm:\n  keep_alive: 5m\n")
    settings = load_agent_settings(path)
    assert settings.tts.temperature == 1.0 and isinstance(settings.tts.temperature, float)
    assert settings.llm.keep_alive == "5m" and settings.tts.top_k == AgentSettings().tts.top_k


def test_ollama_host_from_the_environment_beats_the_shipped_config(monkeypatch):
    """flag > environment > config file > default, with the config file the chat really loads."""
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    assert AgentSettings().llm.host == DEFAULT_HOST
    shipped = load_agent_settings()
    assert shipped.llm.ollama_host and shipped.llm.host == shipped.llm.ollama_host  # the file names a host
    monkeypatch.setenv("OLLAMA_HOST", "http://gpu-box:11434")
    assert load_agent_settings().llm.host == "http://gpu-box:11434"  # the environment beats the file
    assert AgentSettings().llm.host == "http://gpu-box:11434"


def test_chat_with_an_unknown_key_fails_in_one_line(tmp_path, capsys):
    path = tmp_path / "agent.yaml"
    path.write_text("tts:\n  voice: joe\n")
    assert main(["chat", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tts.voice" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
