"""Discriminators for adversarial vocoder training, sized for a CPU: HiFi-GAN's multi-period discriminator
(Kong et al. 2020) and UnivNet's multi-resolution spectrogram discriminator (Jang et al. 2021), as Vocos trains
with, at a fraction of their channels. Hinge losses and feature matching as Vocos.

The regression losses of `istft_vocoder_train` reach what they give (the vocoder card, step 4): they cannot tell a
plausible phase from an average one, and DNSMOS's signal score is where the iSTFT vocoder trails HiFi-GAN V1
(2.98 against 3.23 on 40 round trips). A discriminator judges the waveform as a listener does.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import weight_norm

Judgement = tuple[torch.Tensor, list[torch.Tensor]]  # (logits, the feature maps behind them)


def _judge(convs: nn.ModuleList, post: nn.Module, x: torch.Tensor) -> Judgement:
    """The convolution stack every judge ends in: leaky ReLU after each layer, every layer's output kept."""
    features = []
    for conv in convs:
        x = F.leaky_relu(conv(x), 0.1)
        features.append(x)
    x = post(x)
    features.append(x)
    return x.flatten(1), features


class PeriodDiscriminator(nn.Module):
    """(B, n) audio folded into (B, 1, n / p, p) columns of every p-th sample -> logits and features."""

    def __init__(self, period: int, channels: tuple[int, ...] = (16, 64, 128, 256)):
        super().__init__()
        self.period = period
        sizes = (1, *channels)
        self.convs = nn.ModuleList(
            [weight_norm(nn.Conv2d(a, b, (5, 1), (3, 1), (2, 0))) for a, b in zip(sizes, sizes[1:])]
            + [weight_norm(nn.Conv2d(channels[-1], channels[-1], (5, 1), 1, (2, 0)))])
        self.post = weight_norm(nn.Conv2d(channels[-1], 1, (3, 1), 1, (1, 0)))

    def forward(self, audio: torch.Tensor) -> Judgement:
        x = F.pad(audio, (0, -audio.shape[1] % self.period), mode="reflect")[:, None]
        x = x.view(x.shape[0], 1, -1, self.period)  # (B, 1, n / p, p)
        return _judge(self.convs, self.post, x)


class SpectrogramDiscriminator(nn.Module):
    """(B, n) audio -> its magnitude spectrogram at one resolution, (B, 1, frames, bins) -> logits and features."""

    def __init__(self, n_fft: int, hop: int, channels: int = 16):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        self.convs = nn.ModuleList([weight_norm(nn.Conv2d(1, channels, (3, 9), 1, (1, 4)))]
                                   + [weight_norm(nn.Conv2d(channels, channels, (3, 9), (1, 2), (1, 4))) for _ in range(3)]
                                   + [weight_norm(nn.Conv2d(channels, channels, (3, 3), 1, (1, 1)))])
        self.post = weight_norm(nn.Conv2d(channels, 1, (3, 3), 1, (1, 1)))

    def forward(self, audio: torch.Tensor) -> Judgement:
        spec = torch.stft(audio, self.n_fft, self.hop, self.n_fft, self.window, return_complex=True).abs()
        x = spec.transpose(1, 2)[:, None]  # (B, 1, frames, bins)
        return _judge(self.convs, self.post, x)


class Discriminators(nn.Module):
    """Every judge of one waveform batch: periods 2, 3, 5, 7, 11 and spectrograms at n_fft 512 / 1024 / 2048."""

    def __init__(self, periods: tuple[int, ...] = (2, 3, 5, 7, 11),
                 resolutions: tuple[tuple[int, int], ...] = ((512, 128), (1024, 256), (2048, 512)),
                 period_channels: tuple[int, ...] = (16, 64, 128, 256), spectrogram_channels: int = 16):
        super().__init__()
        self.judges = nn.ModuleList([PeriodDiscriminator(p, period_channels) for p in periods]
                                    + [SpectrogramDiscriminator(n, h, spectrogram_channels) for n, h in resolutions])

    def forward(self, audio: torch.Tensor) -> list[Judgement]:
        return [judge(audio) for judge in self.judges]


def discriminator_loss(real: list[Judgement], fake: list[Judgement]) -> torch.Tensor:
    """Hinge: real logits pushed above 1, generated ones below -1, averaged over the judges."""
    return sum(F.relu(1 - r).mean() + F.relu(1 + f).mean() for (r, _), (f, _) in zip(real, fake)) / len(real)


def generator_loss(fake: list[Judgement]) -> torch.Tensor:
    return sum(F.relu(1 - f).mean() for f, _ in fake) / len(fake)


def feature_matching_loss(real: list[Judgement], fake: list[Judgement]) -> torch.Tensor:
    """L1 between the judges' feature maps of the real and the generated audio (real ones held fixed)."""
    total = 0.0
    for (_, real_features), (_, fake_features) in zip(real, fake):
        total = total + sum(F.l1_loss(f, r.detach()) for r, f in zip(real_features, fake_features)) / len(real_features)
    return total / len(real)
