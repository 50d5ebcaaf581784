"""WORLD feature extraction over a corpus (parallel, resumable) and built-in codec training."""
from __future__ import annotations

import json
import multiprocessing as mp
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tts.codec import world
from tts.codec.world_codec import BuiltinCodec, CodecConfig, FeatureCodec, codec_loss
from tts.data.corpus import read_manifest
from tts.data.features import feature_path, load_audio
from tts.errors import UserError

MANIFESTS = ("train", "val", "test", "zeroshot")








def _extract_one(args: tuple[str, str]) -> str:
    corpus, audio_filepath = Path(args[0]), args[1]
    out = feature_path(corpus, audio_filepath)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        features = world.analyze(load_audio(corpus, audio_filepath))
        tmp = out.with_suffix(".tmp.npy")
        np.save(tmp, features)
        tmp.replace(out)
    return audio_filepath


def extract_features(
    corpus: Path, workers: int = 2, progress=None, manifests: tuple[str, ...] = MANIFESTS,
    speakers: list[str] | None = None, per_speaker: int | None = None,
) -> int:
    """WORLD features of manifest entries (optionally only some speakers, or the first N per speaker and
    manifest), cached as .npy beside the corpus; what exists is skipped, so it resumes."""
    entries = []
    for name in manifests:
        if not (corpus / f"{name}.jsonl").exists():
            continue
        taken: dict[str, int] = {}
        for e in read_manifest(corpus / f"{name}.jsonl"):
            if (speakers is None or e.speaker in speakers) and (per_speaker is None or taken.get(e.speaker, 0) < per_speaker):
                taken[e.speaker] = taken.get(e.speaker, 0) + 1
                entries.append(e.audio_filepath)
    todo = [(str(corpus), a) for a in entries if not feature_path(corpus, a).exists()]
    task = progress.add_task("WORLD analysis", total=len(entries), completed=len(entries) - len(todo)) if progress else None
    if todo:
        with mp.get_context("spawn").Pool(workers) as pool:
            for _ in pool.imap_unordered(_extract_one, todo, chunksize=4):
                if progress:
                    progress.advance(task)
    return len(entries)


@dataclass
class CodecTrainConfig:
    minutes: float = 25.0
    batch: int = 32
    segment_codes: int = 32  # codec frames per training segment
    lr: float = 2e-3
    seed: int = 0
    max_hours: float = 3.0  # of training features loaded into memory
    # retrain only the decoder of an existing codec (its encoder and FSQ frozen): the codes it makes, and so every
    # tokenised corpus and TTS model trained on them, stay valid
    decoder_only: bool = False
    delta_weight: float = 0.0  # weight of the frame-to-frame spectral change loss (against over-smoothing)


def load_feature_set(corpus: Path, manifest: str, max_hours: float, seed: int) -> list[np.ndarray]:
    """Up to max_hours of cached features, taken round-robin over speakers so that no voice dominates."""
    entries = [e for e in read_manifest(corpus / f"{manifest}.jsonl") if feature_path(corpus, e.audio_filepath).exists()]
    random.Random(seed).shuffle(entries)
    by_speaker: dict[str, list] = {}
    for e in entries:
        by_speaker.setdefault(e.speaker, []).append(e)
    queues = list(by_speaker.values())
    out, seconds = [], 0.0
    while seconds < max_hours * 3600 and any(queues):
        for queue in queues:
            if queue and seconds < max_hours * 3600:
                e = queue.pop()
                out.append(np.load(feature_path(corpus, e.audio_filepath)))
                seconds += e.duration
    if not out:
        raise UserError(f"no WORLD features for {manifest} in {corpus}/features (run `s5 codec features`)")
    return out


def random_segments(features: list[np.ndarray], count: int, length: int, rng: np.random.Generator) -> torch.Tensor:
    batch = []
    for i in rng.integers(0, len(features), count):
        f = features[i]
        if len(f) < length:
            f = np.concatenate([f, np.repeat(f[-1:], length - len(f), axis=0)])
        start = rng.integers(0, len(f) - length + 1)
        batch.append(f[start : start + length])
    return torch.from_numpy(np.stack(batch))


def train_codec(
    corpus: Path, codec_config: CodecConfig, train: CodecTrainConfig, progress=None, log_path: Path | None = None,
    init: BuiltinCodec | None = None,
) -> tuple[BuiltinCodec, dict]:
    """Trains a codec from scratch, or from init's weights (its decoder's too where the shapes match); with
    train.decoder_only, init's encoder and FSQ stay frozen, so the new codec makes exactly init's codes."""
    torch.manual_seed(train.seed)
    rng = np.random.default_rng(train.seed)
    train_set = load_feature_set(corpus, "train", train.max_hours, train.seed)
    val_set = load_feature_set(corpus, "val", 0.2, train.seed)
    model = FeatureCodec(codec_config)
    if init is not None:
        own, theirs = model.decoder.state_dict(), init.model.decoder.state_dict()
        same_decoder = own.keys() == theirs.keys() and all(own[k].shape == v.shape for k, v in theirs.items())
        model.load_state_dict({k: v for k, v in init.model.state_dict().items()
                               if same_decoder or not k.startswith("decoder.")}, strict=False)
    else:
        stacked = np.concatenate(train_set[:500])
        model.feature_mean.copy_(torch.from_numpy(stacked.mean(0)))
        model.feature_std.copy_(torch.from_numpy(stacked.std(0) + 1e-3))
        model.feature_mean[1], model.feature_std[1] = 0.0, 1.0  # voicing stays a 0/1 target
    if train.decoder_only:
        model.encoder.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=train.lr, weight_decay=0.0)
    length = train.segment_codes * codec_config.frames_per_code
    deadline = time.monotonic() + train.minutes * 60
    task = progress.add_task(f"codec {codec_config.frame_rate:.1f} fps", total=train.minutes * 60) if progress else None
    started, step, log = time.monotonic(), 0, {}
    while time.monotonic() < deadline:
        fraction = (time.monotonic() - started) / (train.minutes * 60)
        for group in optimizer.param_groups:
            group["lr"] = train.lr * 0.5 * (1 + np.cos(np.pi * min(fraction, 1.0)))
        features = random_segments(train_set, train.batch, length, rng)
        output, target = model(features)
        losses = codec_loss(output, target, features, model.spectrum_weights(), train.delta_weight)
        optimizer.zero_grad()
        losses["total"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        if log_path is not None and step % 100 == 0:
            with log_path.open("a") as f:
                f.write(json.dumps({"step": step, "minutes": round((time.monotonic() - started) / 60, 2),
                                    **{k: round(float(v.detach()), 4) for k, v in losses.items()}}) + "\n")
        if progress:
            progress.update(task, completed=min(time.monotonic() - started, train.minutes * 60))
    model.eval()
    with torch.no_grad():
        features = random_segments(val_set, 64, length, np.random.default_rng(1))
        output, target = model(features)
        log = {k: round(float(v), 4) for k, v in codec_loss(output, target, features).items()}  # unweighted: comparable
    log.update(steps=step, minutes=round((time.monotonic() - started) / 60, 1))
    return BuiltinCodec(model), log
