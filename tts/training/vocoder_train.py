"""`s5 vocoder distill`: a cheaper HiFi-GAN generator trained on this CPU to sound like the V1 universal one.

The student keeps V1's shape but fewer multi-receptive-field kernels (default 3 and 7: without the kernel-11
resblocks half of the convolution work and most of the right context go). It starts from the teacher's own weights
for every layer it keeps and learns, from the teacher's output on the mel codec's decoded log-mel (what the vocoder
hears in use), to match it: log-mel L1, multi-resolution STFT (spectral convergence + log magnitude) and waveform
L1. No discriminator: the teacher's waveform is the target, so phase has something to follow.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from audio_io.errors import UserError
from tts.codec import mel
from tts.codec.mel_codec import MelCodec
from tts.codec.vocoder import Generator, Vocoder, VocoderConfig, load_vocoder
from tts.data.corpus import speaker_entries
from tts.data.features import cached_log_mel

STFT_RESOLUTIONS = [(512, 128), (1024, 256), (2048, 512)]  # (n_fft, hop)


@dataclass
class VocoderDistillConfig:
    resblock_kernel_sizes: list[int] = field(default_factory=lambda: [3, 7])  # the teacher's kernels to keep
    minutes: float = 60.0
    batch: int = 6
    segment_frames: int = 32  # mel frames a segment is scored on
    margin_frames: int = 16  # context on each side (>= the teacher's receptive field), not scored
    lr: float = 1e-4
    utterances: int = 800  # train-split utterances decoded through the codec (about 50 minutes of speech)
    init_from: str = ""  # a saved student (vocoder folder) to start from, with a fresh optimizer
    speaker: str = "piper_joe"
    seed: int = 0


def student_from_teacher(teacher: Generator, kernels: list[int]) -> Generator:
    """The teacher's shape with only `kernels` in each multi-receptive-field block, every kept layer copied from it."""
    config = teacher.config
    missing = set(kernels) - set(config.resblock_kernel_sizes)
    if missing:
        raise UserError(f"the teacher has no resblocks of kernel {sorted(missing)} (it has {config.resblock_kernel_sizes})")
    keep = [i for i, k in enumerate(config.resblock_kernel_sizes) if k in kernels]
    student = Generator(VocoderConfig(**{**asdict(config), "resblock_kernel_sizes": [config.resblock_kernel_sizes[i] for i in keep],
                                         "resblock_dilation_sizes": [config.resblock_dilation_sizes[i] for i in keep]}))
    state = {}
    for key, value in teacher.state_dict().items():
        if key.startswith("resblocks."):
            index = int(key.split(".")[1])
            stage, j = divmod(index, teacher.num_kernels)
            if j not in keep:
                continue
            key = f"resblocks.{stage * len(keep) + keep.index(j)}." + key.split(".", 2)[2]
        state[key] = value.clone()
    student.load_state_dict(state)
    return student


def stft_loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Multi-resolution spectral convergence + log-magnitude L1 (Parallel WaveGAN) between (B, n) waveforms."""
    total = y.new_zeros(())
    for n_fft, hop in STFT_RESOLUTIONS:
        window = torch.hann_window(n_fft, device=y.device)
        mags = [torch.sqrt(torch.stft(x, n_fft, hop, n_fft, window, return_complex=True).abs().square() + 1e-7)
                for x in (y, target)]
        convergence = torch.linalg.norm(mags[1] - mags[0]) / torch.linalg.norm(mags[1])
        total = total + convergence + F.l1_loss(torch.log(mags[0]), torch.log(mags[1]))
    return total / len(STFT_RESOLUTIONS)


def distill_losses(y: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """(B, n) student and teacher waveforms -> named losses; `total` is what is minimised."""
    losses = {"mel": F.l1_loss(mel.log_mel_torch(y, eps=1e-9), mel.log_mel_torch(target, eps=1e-9)),
              "stft": stft_loss(y, target), "wave": F.l1_loss(y, target)}
    losses["total"] = losses["mel"] + losses["stft"] + 10 * losses["wave"]
    return losses


def decoded_mels(corpus: Path, codec: MelCodec, config, progress=None, entries: list | None = None) -> list[np.ndarray]:
    """The codec round trip of `utterances` seeded train-split utterances: the log-mel the vocoder meets in use."""
    entries = entries or speaker_entries(corpus, config.speaker, config.utterances, config.seed)
    task = progress.add_task("codec round trips", total=len(entries)) if progress else None
    out = []
    for e in entries:
        out.append(codec.decode_features(codec.encode_features(cached_log_mel(corpus, e.audio_filepath))))
        if progress:
            progress.advance(task)
    return out


def segments(mels: list[np.ndarray], count: int, length: int, rng: np.random.Generator) -> torch.Tensor:
    """(count, 80, length) random windows, utterances shorter than `length` padded with silence."""
    batch = []
    for i in rng.integers(0, len(mels), count):
        m = mels[i]
        if len(m) < length:
            m = np.concatenate([m, np.full((length - len(m), mel.N_MELS), mel.LOG_FLOOR, np.float32)])
        start = rng.integers(0, len(m) - length + 1)
        batch.append(m[start : start + length].T)
    return torch.from_numpy(np.stack(batch)).float()


def train_for_minutes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch_losses, out: Path, *,
                      minutes: float, lr: float, clip_norm: float, state_key: str, label: str, warmup_steps: int = 0,
                      extra_state: dict | None = None, progress=None, start_step: int = 0, constant_lr: bool = False,
                      lr_scale: Callable[[int], float] | None = None,
                      on_step: Callable[[int], None] | None = None) -> dict:
    """The vocoders' training loop: resume from out/train_state.pt if it is there, then step for `minutes` of wall
    time (AdamW's rate on a cosine over that budget, after `warmup_steps` counted over the whole run), writing
    out/train_log.jsonl every 10 steps and the fp16 weights (`Vocoder.save`) and train_state.pt (with optimizer
    state, to resume; not for git) every 5 minutes and at the end. batch_losses() -> named losses of one batch,
    `total` minimised. `extra_state`: more modules and optimizers (a discriminator's) saved and resumed with it, by
    name; batch_losses steps those itself. `start_step`: where a run resumed from saved weights (not from
    train_state.pt) counts from; `constant_lr`: no cosine (a campaign over many sessions keeps its rate, or scales it
    by `lr_scale(step)`, a function of the campaign's step so that every session continues one schedule); `on_step`
    is called after every step (a campaign validates and snapshots from it). Returns the step count and the minutes
    taken."""
    extra_state = extra_state or {}
    state_path, step = out / "train_state.pt", start_step
    if state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        model.load_state_dict(state[state_key])
        optimizer.load_state_dict(state["optimizer"])
        for name, part in extra_state.items():
            part.load_state_dict(state[name])
        step = state["step"]
    deadline_s = minutes * 60
    task = progress.add_task(label, total=deadline_s) if progress else None
    started = last_save = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        Vocoder(model).save(out)
        model.train()
        torch.save({state_key: model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                    **{name: part.state_dict() for name, part in extra_state.items()}}, state_path)

    model.train()
    while (elapsed := time.monotonic() - started) < deadline_s:
        warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
        for group in optimizer.param_groups:
            if constant_lr:
                decay = lr_scale(step) if lr_scale else 1.0
            else:
                decay = 0.5 * (1 + np.cos(np.pi * min(elapsed / deadline_s, 1.0)))
            group["lr"] = lr * warm * decay
        losses = batch_losses()
        optimizer.zero_grad()
        losses["total"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        step += 1
        if step % 10 == 0:
            with (out / "train_log.jsonl").open("a") as f:
                f.write(json.dumps({"step": step, "minutes": round(elapsed / 60, 2),
                                    **{k: round(float(v.detach()), 4) for k, v in losses.items()}}) + "\n")
        if time.monotonic() - last_save > 300:
            save()
            last_save = time.monotonic()
        if on_step is not None:
            on_step(step)
        if progress:
            progress.update(task, completed=min(elapsed, deadline_s))
    model.eval()
    save()
    return {"steps": step, "minutes": round((time.monotonic() - started) / 60, 1)}


def distill_vocoder(corpus: Path, codec: MelCodec, out: Path, config: VocoderDistillConfig, progress=None) -> dict:
    """Train the student for `config.minutes` (cosine schedule over the time budget); `out` gets the student's fp16
    weights every 5 minutes and at the end, and train_state.pt (with optimizer state, to resume; not for git)."""
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    teacher = load_vocoder().generator
    # init_from: the committed weights of an unfinished run (same kernels), or a larger student whose kept kernels
    # start this one (e.g. kernel 3 alone from the 3-and-7 student)
    source = Vocoder.load(config.init_from).generator if config.init_from else teacher
    student = student_from_teacher(source, config.resblock_kernel_sizes)
    optimizer = torch.optim.AdamW(student.parameters(), lr=config.lr, betas=(0.8, 0.99), weight_decay=0.0)
    mels = decoded_mels(corpus, codec, config, progress)
    hop, margin, length = mel.HOP, config.margin_frames, config.segment_frames + 2 * config.margin_frames
    scored = slice(margin * hop, (margin + config.segment_frames) * hop)

    def batch_losses() -> dict[str, torch.Tensor]:
        x = segments(mels, config.batch, length, rng)  # (B, 80, S + 2M)
        with torch.no_grad():
            target = teacher(x)[:, 0, scored]
        return distill_losses(student(x)[:, 0, scored], target)

    log = train_for_minutes(student, optimizer, batch_losses, out, minutes=config.minutes, lr=config.lr, clip_norm=10.0,
                            state_key="student", label=f"vocoder distill {config.resblock_kernel_sizes}", progress=progress)
    return {**log, "config": asdict(config)}
