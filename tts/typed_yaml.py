"""YAML config files read into dataclasses, the same way everywhere (agent, model, training, vocoder campaign): a file
that is missing or not YAML, an unknown key, a value of the wrong type is one `ConfigError` line naming the file and
the key; numbers written `1e-3` (a string to YAML 1.1, which PyYAML follows) are numbers.

A file may start from another: `base: s5_default.yaml` (relative to the file) reads that file first, and this
file's keys override its keys, mapping by mapping, so a variant writes only what differs."""
from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from audio_io.errors import UserError


class ConfigError(UserError):
    """A config file a user can fix: the message names the file and the key."""


def read_yaml(path: Path | str, _seen: tuple[Path, ...] = ()) -> Any:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict) or "base" not in data:
        return data
    base_path = path.parent / str(data.pop("base"))
    if base_path.resolve() in _seen:
        raise ConfigError(f"{path}: base {base_path.name} includes itself")
    base = read_yaml(base_path, _seen + (path.resolve(),))
    if not isinstance(base, dict):
        raise ConfigError(f"{path}: base {base_path} is not a mapping")
    return merged(base, data)


def merged(base: dict, override: dict) -> dict:
    """`override`'s keys over `base`'s, mappings merged key by key (a list or a value replaces the base's)."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _typed(annotation, value) -> tuple[bool, Any]:
    """(fits, value as the field wants it): ints are fine for floats, "1e-3" is a float, lists stay lists."""
    hint = typing.get_origin(annotation)
    options = typing.get_args(annotation) if hint in (typing.Union, types.UnionType) else (annotation,)
    for option in options:
        if option is type(None) and value is None:
            return True, None
        if option is bool and isinstance(value, bool):
            return True, value
        if isinstance(value, bool):
            continue
        if option is float and isinstance(value, (int, float)):
            return True, float(value)
        if option in (int, float) and isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                continue
            if option is float or number.is_integer():
                return True, option(number)
        if option in (int, str) and isinstance(value, option):
            return True, value
        if typing.get_origin(option) in (list, tuple) and isinstance(value, (list, tuple)):
            return True, list(value)
        if typing.get_origin(option) is dict and isinstance(value, dict):
            return True, value
        if option is Any:
            return True, value
    return False, value


def build(cls: type, data, where: str, prefix: str = ""):
    """A (nested) config dataclass from a mapping, every value checked against its field's type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {prefix.rstrip('.') or 'the file'} should be a mapping, not {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            raise ConfigError(f"{where}: unknown key {prefix}{key!s} (known: {', '.join(sorted(fields))})")
    values = {}
    for key, value in data.items():
        if dataclasses.is_dataclass(hints[key]):
            values[key] = build(hints[key], value or {}, where, f"{prefix}{key}.")
            continue
        fits, typed = _typed(hints[key], value)
        if not fits:
            raise ConfigError(f"{where}: {prefix}{key} = {value!r} is not a {hints[key]}")
        values[key] = typed
    return cls(**values)
