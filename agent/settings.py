"""One settings path for every command: a command-line flag, then the environment, then the `--config` file, then the
default, each default written once (the dataclasses in `agent/config.py`; a command's own default in
`COMMAND_DEFAULTS`). Every command that speaks or converses calls `add_settings_arguments` on its parser and
`resolve` on its arguments, and reads its settings from the result only.

`s5 COMMAND ... --show-settings` prints the effective settings, one YAML line per key with its origin as a comment,
and exits without loading a model (`show`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import DEFAULT_AGENT_CONFIG, AgentSettings, check_settings
from tts.typed_yaml import ConfigError, build, read_yaml

ORIGINS = ("flag", "env", "config", "default")
ENVIRONMENT = {  # a setting the environment may carry, and the variable's name (the official clients' own)
    "llm.ollama_host": "OLLAMA_HOST",
    "llm.openai_url": "OPENAI_BASE_URL",
    "llm.openai_api_key": "OPENAI_API_KEY",
}
SECRET = {"llm.openai_api_key"}  # shown as set or not, never printed


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets a key."""
    key: str
    option: str
    help: str
    choices: tuple[str, ...] | None = None
    kind: type = str  # str, int, float, or bool (a switch that sets true)


FLAGS = {flag.key: flag for flag in (
    Flag("llm.backend", "--llm", "which LLM answers (auto: Ollama if it answers, else the embedded Gemma 3 270M; "
         "openai: an OpenAI-compatible server; replay: a script's own answers; none: speech only)"),
    Flag("llm.openai_url", "--llm-url", "--llm openai: the server's base URL (also $OPENAI_BASE_URL)"),
    Flag("llm.openai_model", "--llm-model", "--llm openai: the model's name on that server"),
    Flag("llm.ollama_model", "--ollama-model", "the Ollama model tag"),
    Flag("llm.ollama_host", "--ollama-host", "the Ollama server (also $OLLAMA_HOST)"),
    Flag("tts.mode", "--tts", "how words reach the voice: s5 word by word, t5 full context, sentence",
         ("s5", "t5", "sentence")),
    Flag("tts.vocoder", "--vocoder", "auto (timed on this machine: docs/results.md), universal (HiFi-GAN V1: "
         "natural), fast (iSTFT: cheapest), or a folder with vocoder.json + vocoder.safetensors"),
    Flag("tts.max_stretch", "--max-stretch", "s5 pacing: speak up to this much slower while the text lags "
         "(1 = off, at most 2)", kind=float),
    Flag("tts.emit_every", "--emit-every", "t5 / sentence: decoder steps per chunk (default: 0.35 s of frames)",
         kind=int),
    Flag("tts.cfg_scale", "--cfg-scale", "classifier-free guidance (1 = off)", kind=float),
    Flag("audio.output", "--output", "where the sound goes", ("auto", "device", "wav", "null")),
    Flag("audio.device", "--device", "sounddevice output device name or index"),
    Flag("audio.voice", "--voice", "also listen to the microphone (VAD + Whisper); typing still works", kind=bool),
)}

# What each command reads (its flags are the keys here that FLAGS names) and its own defaults, in one table.
COMMANDS: dict[str, tuple[str, ...]] = {
    "chat": ("llm.*", "tts.*", "audio.*", "history_turns", "system_prompt"),
    "replay": ("llm.*", "tts.*", "history_turns", "system_prompt"),
    "say": ("tts.*", "audio.output", "audio.device"),
    "serve": ("llm.*", "tts.vocoder", "tts.top_k", "tts.temperature", "tts.cfg_scale", "tts.max_stretch",
              "tts.emit_every", "history_turns", "system_prompt"),
    "eval": ("tts.mode", "tts.vocoder", "tts.cfg_scale"),
    "bench e2e": ("llm.*", "tts.vocoder", "tts.top_k", "tts.temperature", "tts.cfg_scale", "tts.max_stretch",
                  "tts.emit_every"),
    "bench tts": ("tts.vocoder", "tts.max_stretch", "tts.emit_every"),
    "bench voice": ("tts.vocoder",),
    "bench serve": ("tts.vocoder",),
    "bench paper": ("tts.vocoder",),
    "bench words": ("tts.mode", "tts.vocoder"),
    "wyoming": ("tts.vocoder", "tts.top_k", "tts.temperature", "tts.cfg_scale"),
}
COMMAND_DEFAULTS: dict[str, dict[str, Any]] = {
    "serve": {"llm.backend": "embedded", "tts.vocoder": "fast"},  # many streams share the cores
    "bench serve": {"tts.vocoder": "fast"},  # measures what `s5 serve` runs
    "replay": {"llm.backend": "replay"},  # the script's own answers
    "bench e2e": {"llm.backend": "replay"},
}
EXTRA_BACKENDS = {"replay": ("replay",), "bench e2e": ("replay",), "serve": ("none",)}
FLAG_NAMES = {"tts.mode": {"say": "--mode", "eval": "--mode", "bench words": "--mode"}}  # where a command calls a flag otherwise


def all_keys(settings: AgentSettings | None = None) -> list[str]:
    """Every key, dotted ("llm.backend"), in the dataclasses' order."""
    keys: list[str] = []

    def walk(obj, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            else:
                keys.append(prefix + f.name)

    walk(settings or AgentSettings(), "")
    return keys


def command_keys(command: str) -> list[str]:
    patterns = COMMANDS[command]
    return [key for key in all_keys() if any(key == p or (p.endswith(".*") and key.startswith(p[:-1]))
                                             for p in patterns)]


def option_of(command: str, key: str) -> str:
    return FLAG_NAMES.get(key, {}).get(command, FLAGS[key].option)


def add_settings_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """`--config`, `--show-settings` and a flag for each key the command reads that has one. Flags default to
    None, so `resolve` can tell a flag given from one not given."""
    parser.add_argument("--config", type=Path, default=None,
                        help=f"settings YAML (default: {DEFAULT_AGENT_CONFIG.name} in configs/; keys as "
                             "--show-settings prints them)")
    parser.add_argument("--show-settings", action="store_true",
                        help="print the effective settings and where each comes from, then exit")
    for key in command_keys(command):
        flag = FLAGS.get(key)
        if flag is None:
            continue
        dest = "setting_" + key.replace(".", "__")
        choices = flag.choices
        if key == "llm.backend":
            from agent.config import LLM_BACKENDS

            choices = LLM_BACKENDS + EXTRA_BACKENDS.get(command, ())
        if flag.kind is bool:
            parser.add_argument(option_of(command, key), dest=dest, action="store_const", const=True, default=None,
                                help=flag.help)
        else:
            parser.add_argument(option_of(command, key), dest=dest, type=flag.kind, choices=choices, default=None,
                                help=flag.help)


@dataclass
class Resolved:
    """The settings a command runs with, and where each key came from."""
    command: str
    settings: AgentSettings
    origins: dict[str, str] = field(default_factory=dict)
    config_path: Path | None = None


def get_setting(obj, key: str):
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _flat(data: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _nest(flat: dict[str, Any]) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def resolve(command: str, args: argparse.Namespace | None = None, environ: dict[str, str] | None = None) -> Resolved:
    """Each key from the first source that sets it: flag, environment, config file, default."""
    environ = os.environ if environ is None else environ
    config_path = getattr(args, "config", None)
    if config_path is None and DEFAULT_AGENT_CONFIG.exists():
        config_path = DEFAULT_AGENT_CONFIG
    file_values: dict[str, Any] = {}
    if config_path is not None:
        if not Path(config_path).exists():
            raise ConfigError(f"no settings file at {config_path}")
        data = read_yaml(config_path) or {}
        build(AgentSettings, data, str(config_path))  # unknown keys and wrong types: one line naming them
        file_values = _flat(data)
    defaults = AgentSettings()
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key in all_keys():
        flag_value = getattr(args, "setting_" + key.replace(".", "__"), None) if args is not None else None
        if flag_value is not None:
            values[key], origins[key] = flag_value, "flag"
        elif key in ENVIRONMENT and environ.get(ENVIRONMENT[key]):
            values[key], origins[key] = environ[ENVIRONMENT[key]], "env"
        elif key in file_values:
            values[key], origins[key] = file_values[key], "config"
        elif key in COMMAND_DEFAULTS.get(command, {}):
            values[key], origins[key] = COMMAND_DEFAULTS[command][key], "default"
        else:
            values[key], origins[key] = get_setting(defaults, key), "default"
    where = f"{command} settings" + (f" ({config_path})" if config_path else "")
    settings = build(AgentSettings, _nest(values), where)
    check_settings(settings, where, EXTRA_BACKENDS.get(command, ()))
    return Resolved(command, settings, origins, Path(config_path) if config_path else None)


def _yaml_value(value) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def show(resolved: Resolved, auto_vocoder: str | None = None) -> str:
    """The effective settings as YAML, one line per key: `llm.backend: openai  # config`. `auto_vocoder` says
    what `tts.vocoder: auto` chose here and why."""
    lines = [f"# s5 {resolved.command}: flag > env > config ({resolved.config_path or 'none'}) > default"]
    used = set(command_keys(resolved.command))
    for key in all_keys(resolved.settings):
        value = get_setting(resolved.settings, key)
        shown = ("'(set)'" if value else "null") if key in SECRET else _yaml_value(value)
        note = resolved.origins[key]
        if key == "tts.vocoder" and value == "auto" and auto_vocoder:
            note += f"; auto -> {auto_vocoder}"
        if key not in used:
            note += "; not read by this command"
        lines.append(f"{key}: {shown}  # {note}")
    return "\n".join(lines)


def auto_vocoder_note(settings: AgentSettings) -> str | None:
    """What `auto` picks here, from this machine's cached timings (no model is loaded: without timings, say so)."""
    if settings.tts.vocoder != "auto":
        return None
    from tts.codec.vocoder_choice import choose, describe, read_cached_step

    cached = read_cached_step()
    if cached is None:
        return "not yet timed on this machine (the first command that speaks times the vocoders, about a second)"
    timings, step_s, frame_rate = cached
    chosen, verdicts = choose(timings, step_s, frame_rate)
    return describe(chosen, verdicts)


def settings_for(command: str, args: argparse.Namespace):
    """The command's settings (`agent/settings.py`); with `--show-settings` they are printed and the command ends."""
    resolved = resolve(command, args)
    if getattr(args, "show_settings", False):
        print(show(resolved, auto_vocoder_note(resolved.settings)))
        raise SettingsShown
    return resolved.settings


class SettingsShown(Exception):
    """`--show-settings` printed them: the command stops there, successfully."""
