"""IMSD on tiny models: the losses, the ASR filter on D_text, and a few real distillation steps."""
import json

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config
from tts.data.tokens import TokenizedUtterance, save_shard
from tts.frontend.g2p import SymbolTable
from tts.inference.export import export_weights
from tts.model.s5tts import S5TTS
from tts.training.distill import (
    DistillConfig,
    distill,
    distill_schedule,
    kl_teacher_student,
    teacher_text_set,
)


def test_kl_is_zero_for_equal_logits_and_positive_otherwise():
    logits = torch.randn(2, 5, 3, 7)
    mask = torch.ones(2, 5, dtype=torch.bool)
    assert float(kl_teacher_student(logits, logits, mask)) == pytest.approx(0.0, abs=1e-6)
    assert float(kl_teacher_student(logits, torch.randn(2, 5, 3, 7), mask)) > 0
    mask[:, 2:] = False  # masked positions do not count
    other = logits.clone()
    other[:, 2:] = 0
    assert float(kl_teacher_student(logits, other, mask)) == pytest.approx(0.0, abs=1e-6)


def test_asr_filter_drops_teacher_babble(tiny_bundle):
    sentences = ["Hello there, how are you?", "The train leaves at noon."]
    kept, stats = teacher_text_set(tiny_bundle(None), sentences, asr_filter=True)
    assert stats == {"generated": 2, "kept": 0, "kept_fraction": 0.0} and kept == []  # a random teacher babbles
    kept, stats = teacher_text_set(tiny_bundle(None), sentences, asr_filter=False)
    assert stats["kept"] == 2
    for u in kept:  # frame-to-word alignment from the synthesizer's own word chunks
        assert u.frame_words is not None and len(u.frame_words) == u.codes.shape[1]
        assert u.frame_words[0] == 1 and np.all(np.diff(u.frame_words) >= 0)


@pytest.mark.slow
def test_distillation_runs_and_moves_the_student_towards_the_teacher(tmp_path):
    symbols = SymbolTable.default()
    vocab = dict(phoneme_vocab_size=len(symbols), num_codebooks=8, codebook_size=1000, code_levels=[8, 5, 5, 5])
    torch.manual_seed(0)
    export_weights(S5TTS(tiny_config(None, **vocab)), tmp_path / "teacher", symbols)
    torch.manual_seed(1)
    export_weights(S5TTS(tiny_config(2, **vocab)), tmp_path / "student", symbols)
    rng = np.random.default_rng(0)
    utterances = [TokenizedUtterance("a b", "piper_joe", [[10, 11], [12]], rng.integers(0, 1000, (8, 12)).astype(np.int16),
                                     np.repeat([1, 2], 6).astype(np.int16)) for _ in range(6)]
    (tmp_path / "tokens").mkdir()
    save_shard(tmp_path / "tokens" / "train-0000.npz", utterances)
    schedule = distill_schedule(data=str(tmp_path / "tokens"), out=str(tmp_path / "run"), batch_frames=48, max_steps=25,
                                lr=3e-3, warmup_steps=1)
    config = DistillConfig(teacher=str(tmp_path / "teacher"), student=str(tmp_path / "student"), asr_filter=False,
                           ce_weight=0.0, train=schedule)  # the teacher never saw these random codes: follow the teacher only
    result = distill(config, ["Good morning.", "See you soon."])
    assert result["steps"] == 25 and result["d_text"]["kept"] == 2
    log = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"audio_kl", "text_kl", "audio_hidden_mse", "text_ce"} <= set(log[0])
    def distance(r):
        return r["audio_kl"] + r["text_kl"] + 10 * (r["audio_hidden_mse"] + r["text_hidden_mse"])

    first, last = np.mean([distance(r) for r in log[:3]]), np.mean([distance(r) for r in log[-3:]])
    assert last < 0.7 * first
    assert (tmp_path / "run" / "export" / "model.safetensors").exists()
