"""Log-mel features of a corpus (cached as fp16 .npy, resumable) and mel codec training (`s5 codec train`)."""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from audio_io.errors import UserError
from tts.codec.mel_codec import MelCodec, MelCodecConfig, MelCodecModel, mel_codec_loss
from tts.data.corpus import read_manifest
from tts.data.features import cached_log_mel


def random_segments(features: list[np.ndarray], count: int, length: int, rng: np.random.Generator) -> torch.Tensor:
    """(count, length, D) random windows; an utterance shorter than `length` repeats its last frame."""
    batch = []
    for i in rng.integers(0, len(features), count):
        f = features[i]
        if len(f) < length:
            f = np.concatenate([f, np.repeat(f[-1:], length - len(f), axis=0)])
        start = rng.integers(0, len(f) - length + 1)
        batch.append(f[start : start + length])
    return torch.from_numpy(np.stack(batch))


def load_mel_set(corpus: Path, manifest: str, max_hours: float, seed: int, speakers: list[str] | None = None,
                 progress=None) -> list[np.ndarray]:
    """Up to max_hours of the manifest's log-mel frames (computed and cached where missing), in a seeded order."""
    entries = [e for e in read_manifest(corpus / f"{manifest}.jsonl") if speakers is None or e.speaker in speakers]
    if not entries:
        raise UserError(f"no utterances in {corpus}/{manifest}.jsonl" + (f" for {', '.join(speakers)}" if speakers else ""))
    random.Random(seed).shuffle(entries)
    taken, seconds = [], 0.0
    for e in entries:
        if seconds >= max_hours * 3600:
            break
        taken.append(e)
        seconds += e.duration
    task = progress.add_task(f"log-mel {manifest}", total=len(taken)) if progress else None
    out = []
    for e in taken:
        out.append(cached_log_mel(corpus, e.audio_filepath))
        if progress:
            progress.advance(task)
    return out


@dataclass
class MelCodecTrainConfig:
    minutes: float = 25.0
    batch: int = 16
    segment_frames: int = 128  # log-mel frames per training segment (a multiple of the stack)
    lr: float = 1e-3
    seed: int = 0
    max_hours: float = 6.0  # of training audio held in memory as log-mel
    speakers: list[str] | None = None  # the voices to learn (default: all of the corpus)


def decoder_from(saved: MelCodec, decoder_lookahead: int) -> MelCodecModel:
    """A model with the saved codec's encoder, quantiser and normalisation (so its codes, and every corpus
    tokenised and model trained on them, stay valid) and its decoder, re-cut to `decoder_lookahead`: the input
    conv's taps are copied by time offset (taps the new kernel does not have are dropped, new ones start at zero)."""
    model = MelCodecModel(replace(saved.config, decoder_lookahead=decoder_lookahead))
    state = saved.model.state_dict()
    old, new = saved.model.decoder.inp, model.decoder.inp
    weight = torch.zeros_like(new.weight)
    for tap in range(new.kernel_size[0]):
        old_tap = tap - new.left + old.left  # the same time offset in the old kernel
        if 0 <= old_tap < old.kernel_size[0]:
            weight[:, :, tap] = state["decoder.inp.weight"][:, :, old_tap]
    state["decoder.inp.weight"] = weight
    model.load_state_dict(state)
    return model


def train_mel_codec(corpus: Path, config: MelCodecConfig, train: MelCodecTrainConfig, progress=None,
                    log_path: Path | None = None, checkpoint: Path | None = None,
                    decoder_of: MelCodec | None = None) -> tuple[MelCodec, dict]:
    """L1 on normalised log-mel, AdamW with a cosine schedule over the time budget; the weights are saved to
    `checkpoint` every few minutes (a stopped run leaves a usable codec). With `decoder_of`, only a decoder is
    trained (`config.decoder_lookahead`, started from that codec's) under its frozen encoder: the codes stay."""
    torch.manual_seed(train.seed)
    rng = np.random.default_rng(train.seed)
    train_set = load_mel_set(corpus, "train", train.max_hours, train.seed, train.speakers, progress)
    val_set = load_mel_set(corpus, "val", 0.2, train.seed, train.speakers)
    if decoder_of is None:
        model = MelCodecModel(config)
        stacked = np.concatenate(train_set[:500])
        model.mel_mean.copy_(torch.from_numpy(stacked.mean(0)))
        model.mel_std.copy_(torch.from_numpy(stacked.std(0) + 1e-3))
        trained = model
    else:
        model = decoder_from(decoder_of, config.decoder_lookahead)
        model.encoder.requires_grad_(False)
        trained = model.decoder
    optimizer = torch.optim.AdamW(trained.parameters(), lr=train.lr, weight_decay=0.0)
    deadline_s = train.minutes * 60
    task = progress.add_task(f"mel codec {config.frame_rate:.1f} fps", total=deadline_s) if progress else None
    started = last_save = time.monotonic()
    step = 0
    while (elapsed := time.monotonic() - started) < deadline_s:
        for group in optimizer.param_groups:
            group["lr"] = train.lr * 0.5 * (1 + np.cos(np.pi * min(elapsed / deadline_s, 1.0)))
        batch = random_segments(train_set, train.batch, train.segment_frames, rng)
        output, target = model(batch)
        losses = mel_codec_loss(output, target)
        optimizer.zero_grad()
        losses["total"].backward()
        torch.nn.utils.clip_grad_norm_(trained.parameters(), 1.0)
        optimizer.step()
        step += 1
        if log_path is not None and step % 50 == 0:
            with log_path.open("a") as f:
                f.write(json.dumps({"step": step, "minutes": round(elapsed / 60, 2),
                                    **{k: round(float(v.detach()), 4) for k, v in losses.items()}}) + "\n")
        if checkpoint is not None and time.monotonic() - last_save > 300:
            MelCodec(model).save(checkpoint)
            model.train()
            last_save = time.monotonic()
        if progress:
            progress.update(task, completed=min(elapsed, deadline_s))
    model.eval()
    with torch.no_grad():
        batch = random_segments(val_set, 64, train.segment_frames, np.random.default_rng(1))
        log = {k: round(float(v), 4) for k, v in mel_codec_loss(*model(batch)).items()}
    log.update(steps=step, minutes=round((time.monotonic() - started) / 60, 1))
    codec = MelCodec(model)
    if checkpoint is not None:
        codec.save(checkpoint)
    return codec, log
