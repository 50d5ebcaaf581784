"""The trainer on a tiny random tokenised corpus: batches, resume, export, and DDP over 2 CPU processes."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config
from tts.data.tokens import TokenizedUtterance, load_tokenized, save_shard
from tts.inference.export import load_exported
from tts.model.batch import collate
from tts.training.trainer import (
    BucketSampler,
    TrainConfig,
    Trainer,
    learning_rate,
    make_example,
    prior_strength,
    train,
)


def _fake_corpus(directory: Path, n_train: int = 24, codebook_size: int = 20, K: int = 3) -> None:
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("val", 4)):
        utterances = []
        for i in range(n):
            W = int(rng.integers(2, 6))
            words = [rng.integers(10, 60, int(rng.integers(1, 4))).tolist() for _ in range(W)]
            T = int(rng.integers(W + 8, 30))
            frame_words = np.sort(np.concatenate([np.arange(1, W + 1), rng.integers(1, W + 1, T - W)])).astype(np.int16) if i % 2 else None
            utterances.append(TokenizedUtterance(f"u{i}", f"spk{i % 2}", words, rng.integers(0, codebook_size, (K, T)).astype(np.int16), frame_words))
        save_shard(directory / f"{split}-0000.npz", utterances)


def test_shards_round_trip(tmp_path):
    _fake_corpus(tmp_path)
    utterances = load_tokenized(tmp_path, "train")
    assert len(utterances) == 24 and utterances[1].frame_words is not None and utterances[0].frame_words is None
    assert sum(len(w) for w in utterances[3].words) > 0 and utterances[3].codes.shape[0] == 3


def test_collate_and_prompt_continuation(tmp_path):
    _fake_corpus(tmp_path)
    a, b = load_tokenized(tmp_path, "train")[1:3:1][0], load_tokenized(tmp_path, "train")[3]
    example = make_example(a, b)
    batch = collate([example, make_example(b, None)])
    assert int(batch.prompt_lens[0]) == b.codes.shape[1] and int(batch.prompt_lens[1]) == 0
    n_words = len(a.words) + len(b.words)
    assert int(batch.text_words[0].max()) == n_words + 1  # EOS is its own word
    assert int(batch.frame_words[0, : example.codes.shape[1]].max()) == n_words
    assert batch.text[0, 0] == 1 and batch.text[0, int(batch.text_lens[0]) - 1] == 2


def test_bucket_sampler_covers_everything_once_per_epoch(tmp_path):
    _fake_corpus(tmp_path)
    utterances = load_tokenized(tmp_path, "train")
    sampler = BucketSampler(utterances, TrainConfig(batch_frames=80))
    batches = sampler.epoch()
    assert sum(len(b) for b in batches) == len(utterances)
    assert all(len(b) * max(e.codes.shape[1] for e in b) <= 80 or len(b) == 1 for b in batches)
    # two ranks split the batches without overlap
    ranks = [BucketSampler(utterances, TrainConfig(batch_frames=80), r, 2).epoch() for r in (0, 1)]
    ids = [{id(e.codes) for b in r for e in b} for r in ranks]
    assert not (ids[0] & ids[1])


def test_schedules():
    c = TrainConfig(lr=1e-3, lr_min=1e-4, warmup_steps=10, max_steps=110, prior_full_until=20, prior_zero_at=40)
    assert learning_rate(0, c) == pytest.approx(1e-4) and learning_rate(9, c) == pytest.approx(1e-3)
    assert learning_rate(60, c) == pytest.approx(5.5e-4) and learning_rate(110, c) == pytest.approx(1e-4)
    assert prior_strength(10, c) == 1.0 and prior_strength(30, c) == pytest.approx(0.5) and prior_strength(50, c) == 0.0


def test_train_resume_and_export(tmp_path):
    _fake_corpus(tmp_path / "tokens")
    config = TrainConfig(data=str(tmp_path / "tokens"), out=str(tmp_path / "run"), batch_frames=120, max_steps=6,
                         warmup_steps=2, val_every=3, val_batches=1, grad_accum=2)
    assert train(tiny_config(2), config) == 6
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == list(range(1, 7)) and "val_total" in lines[2]
    config.max_steps = 8
    trainer = Trainer(tiny_config(2), config)
    assert trainer.step == 6  # resumed from the checkpoint
    model, symbols, meta = load_exported(tmp_path / "run" / "export")
    assert meta["step"] == 6 and symbols.symbols[:3] == ["<pad>", "<bos>", "<eos>"]
    assert model.config.lookahead_words == 2
    # a new session starts a fresh run from the released weights: same weights, the step count carries on
    fresh = Trainer(tiny_config(2), TrainConfig(data=config.data, out=str(tmp_path / "next"), max_steps=10,
                                                init_from=str(tmp_path / "run" / "export")))
    assert fresh.step == 6
    for name, value in model.state_dict().items():
        assert torch.allclose(fresh.model.state_dict()[name].float(), value.float())
    # ... or, for a new codec, the same weights with the schedule (warm-up, prior) started anew
    restarted = Trainer(tiny_config(2), TrainConfig(data=config.data, out=str(tmp_path / "new_codec"), max_steps=10,
                                                    init_from=str(tmp_path / "run" / "export"), restart_schedule=True))
    assert restarted.step == 0
    assert torch.equal(restarted.model.state_dict()["aux_attention.audio_proj.2.weight"], fresh.model.state_dict()["aux_attention.audio_proj.2.weight"])


@pytest.mark.slow
def test_ddp_two_cpu_processes_keep_identical_weights(tmp_path):
    _fake_corpus(tmp_path / "tokens", n_train=32)
    script = tmp_path / "ddp_check.py"
    script.write_text(
        "import sys, torch, torch.distributed as dist\n"
        "from tests.conftest import tiny_config\n"
        "from tts.training.trainer import TrainConfig, Trainer, train\n"
        "from tts.data.tokens import load_tokenized\n"
        "config = TrainConfig(data=sys.argv[1], out=sys.argv[2], batch_frames=120, max_steps=3, warmup_steps=1, val_every=100, seed=0)\n"
        "trainer = Trainer(tiny_config(2), config)\n"
        "trainer.fit(load_tokenized(config.data, 'train'), load_tokenized(config.data, 'val'))\n"
        "flat = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])\n"
        "torch.save(flat, f'{sys.argv[2]}/weights_rank{dist.get_rank()}.pt')\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]), OMP_NUM_THREADS="1")
    with socket.socket() as probe:  # a port free now: a fixed one can be taken (EADDRINUSE on a fresh clone)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port), str(script),
         str(tmp_path / "tokens"), str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    w0, w1 = (torch.load(tmp_path / "run" / f"weights_rank{r}.pt") for r in (0, 1))
    assert torch.equal(w0, w1)
    initial = torch.cat([p.detach().flatten() for p in __import__("tts.model.s5tts", fromlist=["S5TTS"]).S5TTS(tiny_config(2)).parameters()])
    assert not torch.equal(w0, initial)  # they trained


def test_validation_writes_audio_samples_of_the_current_weights(tmp_path):
    """With the shipped codec's code space the trainer speaks validation sentences into out/samples/."""
    from audio_io.wav import read_wav

    config = TrainConfig(out=str(tmp_path / "run"), samples=2)
    trainer = Trainer(tiny_config(2, num_codebooks=8, codebook_size=1000), config)
    trainer.step = 500
    paths = trainer.write_samples(["Good morning.", "See you soon."])
    assert [p.name for p in paths] == ["step000500_0.wav", "step000500_1.wav"]
    audio, rate = read_wav(paths[0])
    assert rate == 22050 and len(audio) > 0 and np.isfinite(audio).all()
    assert trainer.model.training  # the run goes on training: the samples came from a copy
    other = Trainer(tiny_config(2), TrainConfig(out=str(tmp_path / "small")))  # 3 x 20 codes: no codec to speak them
    assert other.write_samples(["Good morning."]) == []
