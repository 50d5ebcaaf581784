"""`s5 codec vocoder --kind istft`: train the Vocos-style vocoder (`tts/codec/istft_vocoder.py`) on this CPU.

Input: the mel codec's decoded log-mel of train-split utterances (what the vocoder hears in use). Target: HiFi-GAN
V1's audio from the same log-mel (`teacher`, the default), or the Piper voice's own recording of it. The recording's
phase is not a function of the decoded log-mel (the codec dropped what fixes it), so a regression towards it
averages; V1's output is such a function, and a student can follow it. The losses of APNet (Ai & Ling 2023) that
supervise magnitude and phase directly: log-mel L1, log-magnitude L1 at the vocoder's own STFT, multi-resolution
STFT, and the anti-wrapped phase losses (instantaneous phase, group delay, instantaneous frequency). The predicted
spectrum of frame t is compared with the target's STFT frame centred on the same sample.

`adversarial` adds small discriminators (`discriminators.py`), as Vocos and HiFi-GAN train, that take the teacher's
audio of the same log-mel (or the recordings) for real; their feature maps give a feature-matching loss too. Tried
here for 700-1000 steps (vocoder card, step 5): not adopted.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from audio_io.errors import UserError
from tts.codec import mel
from tts.codec.istft_vocoder import IstftGenerator, IstftVocoderConfig
from tts.codec.mel_codec import MelCodec
from tts.codec.vocoder import Vocoder, load_vocoder
from tts.data.corpus import speaker_entries
from tts.data.features import cache_path, cached_fp16, load_audio
from tts.training.discriminators import Discriminators, discriminator_loss, feature_matching_loss, generator_loss
from tts.training.vocoder_train import decoded_mels, stft_loss, train_for_minutes


@dataclass
class IstftTrainConfig:
    minutes: float = 60.0
    batch: int = 16
    segment_frames: int = 48  # mel frames a segment is scored on
    context_frames: int = 16  # unscored frames before them (the causal convolutions' history)
    lr: float = 5e-4
    utterances: int = 800
    phase_weight: float = 1.0
    amp_weight: float = 1.0  # log-magnitude L1 at the vocoder's own STFT (against the recordings: a phase-free target)
    teacher: str = "universal"  # the vocoder whose audio is the target (cached beside the corpus); "" for the recordings
    init_from: str = ""  # a saved iSTFT vocoder (folder) to continue from, with a fresh optimizer (a new session)
    adversarial: bool = False  # add discriminators (`discriminators.py`) that judge its audio
    disc_real: str = "teacher"  # what they take for real: the teacher's audio of the same log-mel, or "recordings"
    adv_weight: float = 0.1  # the hinge loss's weight beside the regression losses (their mel L1 has weight 1)
    fm_weight: float = 0.1  # feature matching's
    disc_lr: float = 2e-4
    disc_warmup_steps: int = 150  # steps that train only the discriminators, before they push the generator
    disc_batch: int = 8  # windows of each batch the discriminators judge (they cost more than the generator here)
    disc_channels: list[int] = field(default_factory=lambda: [16, 64, 128, 256])  # the period judges' widths
    disc_spec_channels: int = 16  # the spectrogram judges' width
    device: str = "cpu"  # "cuda" where a GPU is: the batches are cut on the CPU and moved
    speaker: str = "piper_joe"
    seed: int = 0


def anti_wrap(x: torch.Tensor) -> torch.Tensor:
    """|x| modulo 2 pi, folded to [0, pi]: the distance between two phases."""
    return torch.abs(x - 2 * math.pi * torch.round(x / (2 * math.pi)))


def phase_losses(phase: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """(B, T, 513) predicted and target phase -> instantaneous phase, group delay (along frequency),
    instantaneous frequency (along time) distances."""
    return {"ip": anti_wrap(phase - target).mean(),
            "gd": anti_wrap(torch.diff(phase, dim=2) - torch.diff(target, dim=2)).mean(),
            "iaf": anti_wrap(torch.diff(phase, dim=1) - torch.diff(target, dim=1)).mean()}


def teacher_audio(corpus: Path, audio_filepath: str, decoded: np.ndarray, teacher: str) -> np.ndarray:
    """The teacher vocoder's audio from an utterance's decoded log-mel, computed once and cached (fp16 .npy) beside
    the corpus: V1 costs about 0.7 x real time here, far more than a training step uses it."""
    path = cache_path(corpus, audio_filepath, f"vocoded_{Path(teacher).name}")
    return cached_fp16(path, lambda: load_vocoder(teacher)(decoded))


def training_pairs(corpus: Path, codec: MelCodec, config: IstftTrainConfig,
                   progress=None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(decoded log-mel (T, 80), target audio, the recording), audio padded to T * 256 samples, per utterance."""
    entries = speaker_entries(corpus, config.speaker, config.utterances, config.seed)
    mels = decoded_mels(corpus, codec, config, progress, entries)
    task = progress.add_task(f"targets ({config.teacher or 'recordings'})", total=len(entries)) if progress else None
    pairs = []
    for e, m in zip(entries, mels):
        recording = load_audio(corpus, e.audio_filepath)
        audio = teacher_audio(corpus, e.audio_filepath, m, config.teacher) if config.teacher else recording
        if progress:
            progress.advance(task)
        n = len(m) * mel.HOP
        pairs.append((m, *(np.pad(a, (0, max(0, n - len(a))))[:n] for a in (audio, recording))))
    return pairs


def _window(signal: np.ndarray, start: int, length: int, fill: float = 0.0) -> np.ndarray:
    """signal[start : start + length] along its first axis, `fill` where that runs past either end."""
    out = np.full((length, *signal.shape[1:]), fill, np.float32)
    lo, hi = max(start, 0), min(start + length, len(signal))
    if hi > lo:
        out[lo - start : hi - start] = signal[lo:hi]
    return out


def batch(pairs: list[tuple[np.ndarray, np.ndarray, np.ndarray]], config: IstftTrainConfig,
          rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, 80, C + S) log-mel windows; (B, S * 256) target audio under the scored S frames; (B, S * 256 + 768)
    the same audio with the 512 samples before and 256 after it that the scored frames' STFT windows cover;
    (B, S * 256) the recording under the scored frames."""
    C, S, hop, half = config.context_frames, config.segment_frames, mel.HOP, mel.N_FFT // 2
    x, wide, real = [], [], []
    for i in rng.integers(0, len(pairs), config.batch):
        m, audio, recording = pairs[i]
        start = int(rng.integers(-C, max(1, len(m) - C - S // 2)))  # the scored part may hang over either end
        x.append(_window(m, start, C + S, mel.LOG_FLOOR).T)
        a0 = (start + C) * hop - half  # the target from 512 samples before the first scored frame's centre
        wide.append(_window(audio, a0, S * hop + 2 * half - hop))
        real.append(_window(recording, a0 + half, S * hop))
    wide_t = torch.from_numpy(np.stack(wide)).to(config.device)
    return (torch.from_numpy(np.stack(x)).to(config.device), wide_t[:, half : half + S * hop], wide_t,
            torch.from_numpy(np.stack(real)).to(config.device))


def losses(generator: IstftGenerator, x: torch.Tensor, target: torch.Tensor, wide: torch.Tensor,
           config: IstftTrainConfig) -> dict[str, torch.Tensor]:
    """The regression losses; "total" their sum, and "audio" the scored frames' samples (B, S * 256)."""
    C, hop = config.context_frames, mel.HOP
    log_mag, phase = generator.spectrum(x)  # (B, C + S, 513)
    y = generator.overlap_add(generator.frames(log_mag, phase))[:, 0, C * hop :]  # the scored frames' samples
    spec = torch.stft(wide, mel.N_FFT, hop, mel.N_FFT, generator.window, center=False, return_complex=True)
    spec = spec.transpose(1, 2)  # (B, S, 513): frame j centred on scored frame j
    out = {"mel": F.l1_loss(mel.log_mel_torch(y, eps=1e-9), mel.log_mel_torch(target, eps=1e-9)),
           "amp": F.l1_loss(log_mag[:, C:], torch.log(spec.abs().clamp(min=1e-5))),
           "stft": stft_loss(y, target),
           **phase_losses(phase[:, C:], torch.angle(spec))}
    out["total"] = (out["mel"] + config.amp_weight * out["amp"] + out["stft"]
                    + config.phase_weight * (out["ip"] + out["gd"] + out["iaf"]))
    out["audio"] = y
    return out


class AdversarialLosses:
    """The regression losses plus the discriminators' judgement, as one batch_losses for `train_for_minutes`: each
    call first steps the discriminators on the batch (`disc_real` real, the generator's audio fake), then returns
    the generator's losses. The first `disc_warmup_steps` calls of a run with fresh discriminators leave the generator's
    losses as they are, so a discriminator that has not learned yet does not push it at random."""

    def __init__(self, generator: IstftGenerator, pairs, config: IstftTrainConfig, rng: np.random.Generator):
        self.generator, self.pairs, self.config, self.rng = generator, pairs, config, rng
        self.discriminators = Discriminators(period_channels=tuple(config.disc_channels),
                                             spectrogram_channels=config.disc_spec_channels).to(config.device)
        self.optimizer = torch.optim.AdamW(self.discriminators.parameters(), lr=config.disc_lr, betas=(0.8, 0.9))
        self.calls = 0

    def state(self) -> dict:
        return {"discriminators": self.discriminators, "disc_optimizer": self.optimizer}

    def __call__(self) -> dict[str, torch.Tensor]:
        x, target, wide, real = batch(self.pairs, self.config, self.rng)
        out = losses(self.generator, x, target, wide, self.config)
        n = self.config.disc_batch
        fake, real = out.pop("audio")[:n], (real if self.config.disc_real == "recordings" else target)[:n]
        d_loss = discriminator_loss(self.discriminators(real), self.discriminators(fake.detach()))
        self.optimizer.zero_grad()
        d_loss.backward()
        torch.nn.utils.clip_grad_norm_(self.discriminators.parameters(), 1.0)
        self.optimizer.step()
        self.calls += 1
        out["disc"] = d_loss.detach()
        if self.calls > self.config.disc_warmup_steps:
            with torch.no_grad():
                judged_real = self.discriminators(real)
            judged_fake = self.discriminators(fake)
            out["adv"], out["fm"] = generator_loss(judged_fake), feature_matching_loss(judged_real, judged_fake)
            out["total"] = out["total"] + self.config.adv_weight * out["adv"] + self.config.fm_weight * out["fm"]
        return out


def train_istft_vocoder(corpus: Path, codec: MelCodec, out: Path, model_config: IstftVocoderConfig,
                        config: IstftTrainConfig, progress=None, *, start: dict | None = None,
                        on_step: Callable[[int, IstftGenerator, "AdversarialLosses | None"], None] | None = None,
                        constant_lr: bool = False, lr_scale: Callable[[int], float] | None = None) -> dict:
    """Train for `config.minutes` (`train_for_minutes`: resumes from `out`, saves there). `start`: weights to
    begin from where `out` holds no train_state.pt ({"step", "generator", "discriminators"} state dicts: a campaign's
    committed snapshot); `on_step(step, generator, adversarial)` after every step."""
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed + (start or {}).get("step", 0))  # a resumed run draws new batches
    generator = IstftGenerator(model_config)
    resumable = (out / "train_state.pt").exists()
    if start and not resumable:
        generator.load_state_dict(start["generator"])
    elif config.init_from and not resumable:  # a resumable run in `out` wins
        source = Vocoder.load(config.init_from).generator  # float32 (load_vocoder would halve the blocks)
        if isinstance(source, IstftGenerator) and source.config.lookahead < model_config.lookahead:
            source = source.widened(model_config.lookahead)  # the same function, room to use more context
        if not isinstance(source, IstftGenerator) or source.config != model_config:
            raise UserError(f"{config.init_from} is not an iSTFT vocoder of this shape")
        generator.load_state_dict(source.state_dict())
    generator.to(config.device)
    if config.device.startswith("cuda"):  # fixed shapes every step: let cuDNN pick its fastest convolutions once
        torch.backends.cudnn.benchmark = True
    optimizer = torch.optim.AdamW(generator.parameters(), lr=config.lr, betas=(0.8, 0.9), weight_decay=0.01)
    pairs = training_pairs(corpus, codec, config, progress)
    adversarial = None
    if config.adversarial:
        batch_losses = adversarial = AdversarialLosses(generator, pairs, config, rng)
        extra_state = batch_losses.state()
        if start and start.get("discriminators") and not resumable:
            adversarial.discriminators.load_state_dict(start["discriminators"])
        if resumable or (start and start.get("discriminators")):
            adversarial.calls = config.disc_warmup_steps  # judges that have learned need no warm-up
    else:
        def batch_losses() -> dict[str, torch.Tensor]:
            out = losses(generator, *batch(pairs, config, rng)[:3], config)
            del out["audio"]
            return out
        extra_state = {}
    log = train_for_minutes(generator, optimizer, batch_losses, out, minutes=config.minutes, lr=config.lr, clip_norm=1.0,
                            state_key="generator", label="iSTFT vocoder", warmup_steps=200, extra_state=extra_state,
                            progress=progress, start_step=0 if resumable else (start or {}).get("step", 0),
                            constant_lr=constant_lr, lr_scale=lr_scale,
                            on_step=(lambda step: on_step(step, generator, adversarial)) if on_step else None)
    return {**log, "config": asdict(config)}
