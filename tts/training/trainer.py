"""`s5 train`: tokenised corpus in, S5-TTS (or T5-TTS) checkpoints out.

Length-bucketed batches, M_dec from Piper durations where known and from MAS elsewhere (the beta-binomial
prior's path until the aux attention has warmed up), AdamW with warm-up and cosine decay, gradient accumulation,
bf16 autocast on GPU, resumable checkpoints, a weights-only safetensors export, JSONL metrics, and DDP when
launched by torchrun (gloo on CPU, nccl on GPU).
"""
from __future__ import annotations

import copy
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from audio_io.errors import UserError
from tts.data.tokens import TokenizedUtterance, load_tokenized, tokens_codec_dir
from tts.frontend.g2p import SymbolTable
from tts.inference.export import export_weights, load_exported
from tts.model.batch import Batch, Example, collate
from tts.model.config import ModelConfig, from_dict, resolve_config_path
from tts.model.s5tts import S5TTS
from tts.paths import DEFAULT_TOKENS
from tts.typed_yaml import read_yaml


@dataclass
class TrainConfig:
    data: str = DEFAULT_TOKENS  # folder of tokenised shards (s5 data codes)
    out: str = "runs/s5_default"
    speakers: list[str] = field(default_factory=list)  # empty: every training speaker
    batch_frames: int = 2400  # codec frames per batch (length-bucketed)
    max_frames: int = 400
    grad_accum: int = 1
    lr: float = 1e-3
    lr_min: float = 1e-4
    warmup_steps: int = 500
    max_steps: int = 20000
    weight_decay: float = 0.01
    prompt_probability: float = 0.0  # continuation training: prepend another utterance of the same speaker
    prior_full_until: int = 2000  # beta-binomial prior on cross-attention at full strength until this step
    prior_zero_at: int = 4000  # ... faded to zero here
    aux_warmup_steps: int | None = 1000  # MAS on the prior's path until then, on the aux attention after; None: the
    # prior's path throughout
    val_every: int = 500
    val_batches: int = 8
    samples: int = 2  # at every validation, speak this many validation sentences into out/samples/ (0: none)
    codec_dir: str = ""  # codec for those samples ("" = the shipped one)
    checkpoint_minutes: float = 5.0
    max_minutes: float = 0.0  # 0: no time limit
    seed: int = 0
    threads: int = 0  # torch CPU threads (0: torch's default)
    init_from: str = ""  # exported weights to start a new run from (fresh optimizer; the step count carries on)
    restart_schedule: bool = False  # with init_from: start at step 0 (warm-up, prior, schedule anew), e.g. on a new codec


def load_train_config(path: str | Path) -> tuple[ModelConfig, TrainConfig]:
    path = resolve_config_path(path)
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping with 'model' and 'train' sections")
    return (from_dict(ModelConfig, data.get("model") or {}, f"{path}: model"),
            from_dict(TrainConfig, data.get("train") or {}, f"{path}: train"))


def make_example(target: TokenizedUtterance, prompt: TokenizedUtterance | None) -> Example:
    if prompt is None:
        return Example(target.words, target.codes, target.frame_words)
    frame_words = None
    if prompt.frame_words is not None and target.frame_words is not None:
        frame_words = np.concatenate([prompt.frame_words, target.frame_words + len(prompt.words)])
    return Example(prompt.words + target.words, np.concatenate([prompt.codes, target.codes], axis=1), frame_words, prompt.codes.shape[1])


class BucketSampler:
    """Batches of similar-length utterances holding about `batch_frames` frames; reshuffled every epoch;
    each DDP rank takes every world_size-th batch."""

    def __init__(self, utterances: list[TokenizedUtterance], config: TrainConfig, rank: int = 0, world_size: int = 1):
        self.utterances = [u for u in utterances if u.codes.shape[1] <= config.max_frames]
        self.by_speaker: dict[str, list[TokenizedUtterance]] = {}
        for u in self.utterances:
            self.by_speaker.setdefault(u.speaker, []).append(u)
        self.config, self.rank, self.world_size = config, rank, world_size
        self.rng = random.Random(config.seed)

    def epoch(self) -> list[list[Example]]:
        order = sorted(self.utterances, key=lambda u: u.codes.shape[1] + self.rng.random() * 8)
        batches, current, frames = [], [], 0
        for u in order:
            prompt = None
            if self.config.prompt_probability and self.rng.random() < self.config.prompt_probability:
                candidate = self.rng.choice(self.by_speaker[u.speaker])
                if candidate is not u and candidate.codes.shape[1] + u.codes.shape[1] <= self.config.max_frames:
                    prompt = candidate
            example = make_example(u, prompt)
            length = example.codes.shape[1]
            if current and (len(current) + 1) * max(frames, length) > self.config.batch_frames:
                batches.append(current)
                current, frames = [], 0
            current.append(example)
            frames = max(frames, length)
        if current:
            batches.append(current)
        self.rng.shuffle(batches)
        usable = len(batches) - len(batches) % self.world_size
        return batches[self.rank : usable : self.world_size]


# ---- schedule ---------------------------------------------------------------------------------------------------
def learning_rate(step: int, config: TrainConfig) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = min(1.0, (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps))
    return config.lr_min + 0.5 * (config.lr - config.lr_min) * (1 + math.cos(math.pi * progress))


LossHook = Callable[[torch.nn.Module, Batch], object]  # (model, batch on the device) -> losses (.total, .as_floats())


def prior_strength(step: int, config: TrainConfig) -> float:
    if step < config.prior_full_until:
        return 1.0
    return max(0.0, 1.0 - (step - config.prior_full_until) / max(1, config.prior_zero_at - config.prior_full_until))


class Trainer:
    def __init__(self, model_config: ModelConfig, config: TrainConfig, progress=None):
        self.config = config
        self.distributed = "RANK" in os.environ
        if self.distributed and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if torch.cuda.is_available() else "cpu")
        if config.threads:
            torch.set_num_threads(config.threads)
        torch.manual_seed(config.seed)
        self.out = Path(config.out)
        self.model = S5TTS(model_config).to(self.device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=(0.9, 0.98), weight_decay=config.weight_decay)
        self.step = 0
        self.symbols = SymbolTable.default()
        self._sample_codec = None  # the codec that speaks the validation samples (write_samples)
        self.progress = progress if self.rank == 0 else None
        self._resume()
        self.ddp_model = torch.nn.parallel.DistributedDataParallel(self.model) if self.distributed else self.model

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _resume(self) -> None:
        path = self.out / "checkpoint.pt"
        if not path.exists() and self.config.init_from:  # continue a released model in a new session
            model, _, meta = load_exported(Path(self.config.init_from))
            missing, unexpected = self.model.load_state_dict(model.state_dict(), strict=False)
            if unexpected or set(missing) - {"null_memory"}:  # only a new guidance state may start fresh
                raise UserError(f"--init-from {self.config.init_from}: weights do not fit this config "
                                f"(missing {missing}, unexpected {unexpected})")
            self.step = 0 if self.config.restart_schedule else int(meta.get("step", 0))
            return
        if path.exists():
            state = torch.load(path, map_location=self.device, weights_only=False)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.step = state["step"]

    def save(self) -> None:
        if not self.is_main:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / "checkpoint.tmp"
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                    "model_config": self.model.config.to_dict(), "train_config": asdict(self.config),
                    "symbols": self.symbols.symbols}, tmp)
        tmp.replace(self.out / "checkpoint.pt")
        export_weights(self.model, self.out / "export", self.symbols, {"step": self.step, "train": asdict(self.config)})

    def _log(self, record: dict) -> None:
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            with (self.out / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")

    def _to_device(self, batch: Batch) -> Batch:
        return Batch(*(v.to(self.device) if isinstance(v, torch.Tensor) else v for v in vars(batch).values()))

    def _losses(self, batch: Batch, loss: LossHook | None):
        """The model's own losses, or the hook's (distillation) on the same device and autocast."""
        batch = self._to_device(batch)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            if loss is not None:
                return loss(self.ddp_model, batch)
            return self.ddp_model(batch, prior_strength=prior_strength(self.step, self.config),
                                  use_prior_path=self._prior_path()).losses

    @torch.no_grad()
    def _prior_path(self) -> bool:
        """Monotonic alignment search on the prior's path (else on the auxiliary attention's)."""
        return self.config.aux_warmup_steps is None or self.step < self.config.aux_warmup_steps

    def validate(self, batches: list[list[Example]]) -> dict:
        self.model.eval()
        totals: dict[str, float] = {}
        for examples in batches:
            losses = self.model(self._to_device(collate(examples)), use_prior_path=self._prior_path()).losses.as_floats()
            for k, v in losses.items():
                totals[k] = totals.get(k, 0.0) + v / len(batches)
        self.model.train()
        return totals

    def write_samples(self, texts: list[str]) -> list[Path]:
        """Speak texts with the current weights (a CPU copy) into out/samples/stepNNNNNN_i.wav, so a run can be
        listened to while it trains. Skipped when the codec's code space does not match the model's."""
        from audio_io.wav import write_wav
        from tts.codec.load import load_codec
        from tts.inference.synthesis import SynthesisConfig, TTSBundle, synthesize_text

        if self._sample_codec is None:  # loaded once per run
            self._sample_codec = load_codec(self.config.codec_dir)
        codec, mc = self._sample_codec, self.model.config
        if (codec.num_codebooks, codec.codebook_size) != (mc.num_codebooks, mc.codebook_size):
            return []
        bundle = TTSBundle(copy.deepcopy(self.model).float().cpu(), self.symbols, codec)
        paths = []
        for i, text in enumerate(texts):
            codes, _ = synthesize_text(bundle, text, SynthesisConfig(seed=i))
            path = self.out / "samples" / f"step{self.step:06d}_{i}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_wav(path, codec.decode(codes) if codes.shape[1] else np.zeros(0, np.float32))
            paths.append(path)
        return paths

    def fit(self, train: list[TokenizedUtterance] | dict[str, list[TokenizedUtterance]],
            val: list[TokenizedUtterance] | None = None, loss: LossHook | None = None) -> int:
        """Train to `max_steps` (or `max_minutes`). train: one training set, or named sets whose mini-batches take
        turns inside every accumulation cycle, logged under their name (IMSD: "audio" and "text"). loss: a hook
        `loss(model, batch) -> losses` (with `.total` and `.as_floats()`) in place of the model's own losses."""
        c = self.config
        sets = train if isinstance(train, dict) else {"": train}
        streams = {name: _endless(BucketSampler(data, c, self.rank, self.world_size)) for name, data in sets.items() if data}
        cycle = [list(streams)[i % len(streams)] for i in range(c.grad_accum)]  # source of each mini-batch
        val_batches = []
        if val:
            val_batches = BucketSampler(val, TrainConfig(batch_frames=c.batch_frames, max_frames=c.max_frames), 0, 1).epoch()[: c.val_batches]
        task = self.progress.add_task("training", total=c.max_steps, completed=self.step) if self.progress else None
        started = last_save = time.monotonic()
        self.model.train()
        while self.step < c.max_steps:
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate(self.step, c)
            t0 = time.perf_counter()
            record: dict[str, float] = {}
            for name in cycle:
                losses = self._losses(collate(next(streams[name])), loss)
                (losses.total / c.grad_accum).backward()
                prefix = f"{name}_" if name else ""
                for k, v in losses.as_floats().items():
                    record[prefix + k] = record.get(prefix + k, 0.0) + v / cycle.count(name)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step += 1
            record.update(step=self.step, lr=learning_rate(self.step, c), grad_norm=round(grad_norm, 3), step_s=round(time.perf_counter() - t0, 3))
            if val_batches and self.step % c.val_every == 0 and self.is_main:
                record.update({f"val_{k}": v for k, v in self.validate(val_batches).items()})
                if c.samples:
                    record["samples"] = [str(p) for p in self.write_samples([u.text for u in val[: c.samples]])]
            self._log(record)
            if self.progress:
                self.progress.update(task, completed=self.step, description=f"training loss {record.get('total', record.get(cycle[0] + '_total', 0)):.3f}")
            out_of_time = c.max_minutes and time.monotonic() - started > c.max_minutes * 60
            if time.monotonic() - last_save > c.checkpoint_minutes * 60 or self.step >= c.max_steps or out_of_time:
                self.save()
                last_save = time.monotonic()
            if out_of_time:
                break
        return self.step


def _endless(sampler: BucketSampler) -> Iterator[list[Example]]:
    """Mini-batches epoch after epoch (each epoch reshuffled by the sampler)."""
    while True:
        yield from sampler.epoch()


def train(model_config: ModelConfig, config: TrainConfig, progress=None) -> int:
    train_set = load_tokenized(Path(config.data), "train")
    val_set = load_tokenized(Path(config.data), "val")
    if config.speakers:
        train_set = [u for u in train_set if u.speaker in config.speakers]
        val_set = [u for u in val_set if u.speaker in config.speakers]
    if not train_set:
        raise UserError(f"no training utterances in {config.data} (run `s5 data codes`)")
    made_with = tokens_codec_dir(Path(config.data))
    if not config.codec_dir and made_with:
        config.codec_dir = made_with  # the export names the codec its codes belong to
    trainer = Trainer(model_config, config, progress)
    step = trainer.fit(train_set, val_set or train_set[:32])
    if trainer.distributed:
        dist.barrier()
    return step
