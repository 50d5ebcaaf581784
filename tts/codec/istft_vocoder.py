"""A Vocos-style vocoder (Siuzdak 2023): log-mel -> ConvNeXt blocks at the mel frame rate -> a magnitude and a
phase per STFT bin -> inverse STFT. Every layer runs at 86 frames/s instead of HiFi-GAN's up to 22,050 samples/s,
so it costs a few percent of real time on a CPU core, and its right context is a handful of frames.

Streaming is exact, as the HiFi-GAN generator's: the convolutions are `StreamConv1d` (causal but for `lookahead`
frames at the input) and the overlap-add keeps the tail that later frames still add to. Frame t's window is centred
on sample t * 256, as the log-mel's analysis frames are, so T frames give T * 256 samples.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from tts.codec import mel
from tts.codec.streaming_conv import StreamConv1d, StreamState, native_bf16

BF16_ROWS = 8  # bfloat16 inference pads a chunk's frames to a multiple of this: the CPU library keeps ~1.4 MB per
# distinct row count it has seen (measured: 80 chunk lengths, +130 MB), so lengths come in a few sizes only
WINDOW_POWER_SUM = 1.5  # sum of hann(n - k * hop)^2 over k for hop = n_fft / 4: the overlap-add's constant gain


@dataclass
class IstftVocoderConfig:
    kind: str = "istft"
    dim: int = 384
    intermediate: int = 1152
    layers: int = 8
    kernel: int = 7
    lookahead: int = 2  # mel frames of right context the convolutions see (one in the input conv, the rest in
    # block 0, whose kernel is wider by the extra frames so that its left context stays `kernel - 2`)


class ConvNeXtBlock(nn.Module):
    """x + scale * mlp(layernorm(depthwise_conv(x))), channels first: (B, C, T) -> (B, C, T)."""

    def __init__(self, dim: int, intermediate: int, kernel: int, right: int):
        super().__init__()
        self.dwconv = StreamConv1d(dim, dim, kernel, right=right, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate)
        self.pwconv2 = nn.Linear(intermediate, dim)
        self.scale = nn.Parameter(torch.full((dim,), 1.0 / 8))

    def forward(self, x: torch.Tensor, state: StreamState | None, final: bool) -> torch.Tensor:
        h = self.dwconv(x, state, final)  # lags x by `right` frames when streaming
        if state is not None and self.dwconv.right:
            x = _delay(x, state, (self, "residual"), h.shape[2])
        h = self.norm(h.transpose(1, 2))  # (B, T, C)
        T = h.shape[1]
        if self.pwconv1.weight.dtype == torch.bfloat16:  # inference: see IstftGenerator.use_bf16_blocks
            h = F.pad(h, (0, 0, 0, -T % BF16_ROWS)).to(torch.bfloat16)  # rows are independent: padding changes none
        h = self.pwconv2(F.gelu(self.pwconv1(h)))[:, :T].to(x.dtype)
        return x + (self.scale * h).transpose(1, 2)


def _delay(x: torch.Tensor, state: StreamState, key, n: int) -> torch.Tensor:
    """The first n frames of (held frames + x); the rest is held for the next chunk."""
    held = state.get(key)
    x = x if held is None else torch.cat([held, x], dim=2)
    state[key] = x[:, :, n:]
    return x[:, :, :n]


class IstftGenerator(nn.Module):
    """(B, 80, T) log-mel -> (B, 1, T * 256) audio; streaming with a state dict, as `vocoder.Generator`."""

    def __init__(self, config: IstftVocoderConfig):
        super().__init__()
        self.config = config
        self.embed = StreamConv1d(mel.N_MELS, config.dim, config.kernel, right=min(config.lookahead, 1))
        self.norm = nn.LayerNorm(config.dim, eps=1e-6)
        rights = [max(config.lookahead - 1, 0)] + [0] * (config.layers - 1)
        self.blocks = nn.ModuleList([ConvNeXtBlock(config.dim, config.intermediate, config.kernel + max(r - 1, 0), r)
                                     for r in rights])
        self.final_norm = nn.LayerNorm(config.dim, eps=1e-6)
        self.head = nn.Linear(config.dim, mel.N_FFT + 2)  # log-magnitude and phase of 513 bins
        self.register_buffer("window", torch.hann_window(mel.N_FFT), persistent=False)

    def widened(self, lookahead: int) -> "IstftGenerator":
        """The same function with more right context to learn from: block 0's depthwise kernel grows by the extra
        frames, its new (future) taps zero, so a training run starts where this generator is and may use them."""
        if lookahead < self.config.lookahead or self.config.lookahead < 2:
            raise ValueError(f"can widen a lookahead of 2 or more only upwards ({self.config.lookahead} -> {lookahead})")
        wider = IstftGenerator(replace(self.config, lookahead=lookahead))
        state = self.state_dict()
        old = state["blocks.0.dwconv.weight"]  # (dim, 1, kernel): taps for offsets -left .. +right
        state["blocks.0.dwconv.weight"] = F.pad(old, (0, lookahead - self.config.lookahead))
        wider.load_state_dict(state)
        return wider

    def use_bf16_blocks(self) -> "IstftGenerator":
        """Inference: the blocks' pointwise layers (85% of the weights) in bfloat16, where the CPU computes it
        natively. A push reads every weight once, whatever the chunk's length, so it is bound by memory traffic: a
        push of 5 codec frames 10.2 -> 7.8 ms, of one 6.9 -> 5.6 ms (one thread, caches cold; rows
        padded to `BF16_ROWS`). The audio moves by bfloat16 rounding (SNR 48 dB against float32 on 40 replies,
        the same Whisper WER and DNSMOS)."""
        if native_bf16():
            for block in self.blocks:
                block.pwconv1.to(torch.bfloat16)
                block.pwconv2.to(torch.bfloat16)
        return self

    def spectrum(self, x: torch.Tensor, state: StreamState | None = None, final: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, 80, T) -> log-magnitude and phase, each (B, T', 513): T' = T offline, the frames ready when streaming."""
        h = self.embed(x, state, final)
        h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        for block in self.blocks:
            h = block(h, state, final)
        log_mag, phase = self.head(self.final_norm(h.transpose(1, 2))).chunk(2, dim=2)
        return log_mag, phase

    def frames(self, log_mag: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        """(B, T, 513) each -> (B, 1024, T) windowed time-domain frames."""
        if log_mag.shape[1] == 0:  # MKL's FFT refuses an empty batch
            return log_mag.new_zeros(log_mag.shape[0], mel.N_FFT, 0)
        magnitude = torch.exp(log_mag).clamp(max=100.0)
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        return (torch.fft.irfft(spec, n=mel.N_FFT, dim=2) * self.window).transpose(1, 2)

    def forward(self, x: torch.Tensor, state: StreamState | None = None, final: bool = True) -> torch.Tensor:
        return self.overlap_add(self.frames(*self.spectrum(x, state, final)), state, final)

    def overlap_add(self, frames: torch.Tensor, state: StreamState | None = None, final: bool = True) -> torch.Tensor:
        """(B, 1024, n) windowed frames, frame t centred on sample t * 256 -> (B, 1, n * 256) offline; streaming,
        the samples no later frame adds to (the last 768 wait), and at `final` the utterance's last 512."""
        B, n, hop, half = frames.shape[0], frames.shape[2], mel.HOP, mel.N_FFT // 2
        added = F.fold(frames, (1, (n - 1) * hop + mel.N_FFT), (1, mel.N_FFT), stride=(1, hop))[:, :, 0] if n else \
            frames.new_zeros(B, 1, 0)  # (B, 1, (n - 1) * 256 + 1024): sample 0 is 512 before frame 0's centre
        if state is None:
            return added[:, :, half : half + n * hop] / WINDOW_POWER_SUM
        carry, to_drop = state.get(self, (frames.new_zeros(B, 1, mel.N_FFT - hop), half))
        if n:
            added[:, :, : carry.shape[2]] += carry
            ready, carry = added[:, :, : n * hop], added[:, :, n * hop :]  # later frames add nothing before n * 256
        else:
            ready = frames.new_zeros(B, 1, 0)
        if final:
            ready = torch.cat([ready, carry[:, :, :half]], dim=2)  # up to the last frame's centre + 256
        drop = min(to_drop, ready.shape[2])
        state[self] = (carry, to_drop - drop)
        return ready[:, :, drop:] / WINDOW_POWER_SUM
