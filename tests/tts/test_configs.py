"""Configs say what is: `configs/s5_default.yaml` trains the shipped model's shape, variants inherit from it and
write only what differs, and a base file's keys are overridden mapping by mapping."""
from __future__ import annotations

import json

import pytest

from tts.model.config import ModelConfig, load_model_config
from tts.paths import ASSETS, CONFIGS
from tts.typed_yaml import ConfigError, read_yaml


def test_s5_default_config_is_the_shipped_model():
    shipped = json.loads((ASSETS / "models" / "s5_default" / "model.json").read_text())["model"]
    assert load_model_config(CONFIGS / "s5_default.yaml").to_dict() == ModelConfig(**shipped).to_dict()


@pytest.mark.parametrize("name, k", [("s5_k1", 1), ("s5_k3", 3)])
def test_lookahead_variants_differ_from_their_checkpoint_in_nothing(name, k):
    shipped = json.loads((ASSETS / "models" / name / "model.json").read_text())["model"]
    config = load_model_config(CONFIGS / f"{name}.yaml")
    assert config.lookahead_words == k
    assert config.to_dict() == ModelConfig(**shipped).to_dict()


def test_t5_config_is_the_shipped_teacher():
    shipped = json.loads((ASSETS / "models" / "t5_default" / "model.json").read_text())["model"]
    assert load_model_config(CONFIGS / "t5_default.yaml").to_dict() == ModelConfig(**shipped).to_dict()


def test_base_is_merged_key_by_key(tmp_path):
    (tmp_path / "a.yaml").write_text("model: {d_model: 256, n_heads: 4}\ntrain: {lr: 1.0e-3}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\nmodel: {n_heads: 8}\n")
    assert read_yaml(tmp_path / "b.yaml") == {"model": {"d_model": 256, "n_heads": 8}, "train": {"lr": 1.0e-3}}


def test_a_base_that_includes_itself_is_one_line(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="includes itself"):
        read_yaml(tmp_path / "a.yaml")
