"""The built-in offline codec: 8 FSQ codebooks over WORLD vocoder features.

encode: audio -> WORLD features (86.13 frames/s) -> conv encoder, `frames_per_code` WORLD frames per codec frame
        -> 8 groups of FSQ scalars -> [K, T] codes
decode: codes -> causal conv decoder -> WORLD features -> WORLD synthesis -> audio
The decoder is causal with a bounded receptive field, so streaming decoding keeps only that many codec frames of
left context and never re-decodes the prefix (StreamingCodecDecoder).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from tts.codec import world
from tts.codec.fsq import FSQ  # noqa: F401  (re-exported)
from tts.errors import UserError
from tts.paths import ASSETS


@dataclass
class CodecConfig:
    frames_per_code: int = 4  # WORLD frames per codec frame: 4 -> 21.5 frames/s, 2 -> 43, 1 -> 86
    num_codebooks: int = 8
    levels: list[int] = field(default_factory=lambda: [8, 5, 5, 5])  # FSQ levels per codebook: 1000 codes
    channels: int = 256
    decoder_blocks: int = 3
    decoder_channels: int | None = None  # default: channels (a wider decoder can be retrained on a frozen encoder)
    # spectral loss weights per coded-envelope dimension: "uniform" treats them alike, "variance" weighs each by
    # its variance (the MSE of the raw log envelope: the lowest two terms dominate), "low_order" weighs the lowest
    # terms more (ASR features read the coarse envelope: restoring the lowest 6 of the 40 dimensions to the
    # original took the round trip's WER from 54.3 to 44.9, restoring the highest 28 only to 48.6)
    spectrum_weighting: str = "uniform"
    low_order_boost: float = 3.0  # "low_order": the lowest term weighs 1 + this, decaying over ~6 terms

    @property
    def codebook_size(self) -> int:
        return math.prod(self.levels)

    @property
    def frame_rate(self) -> float:
        return world.SAMPLE_RATE / (world.HOP * self.frames_per_code)

    @property
    def samples_per_frame(self) -> int:
        return world.HOP * self.frames_per_code


# ---- networks ---------------------------------------------------------------------------------------------------
ConvState = dict  # CausalConv -> its last `left` input frames (B, C, left), one dict per streamed utterance


class CausalConv(nn.Conv1d):
    """Conv1d that only looks back: (B, C, T) -> (B, C', T). With a state dict it streams: the input frames it
    still needs are kept there, so chunk by chunk gives exactly the whole-sequence output."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1):
        super().__init__(c_in, c_out, kernel, dilation=dilation)
        self.left = (kernel - 1) * dilation

    def forward(self, x: torch.Tensor, state: ConvState | None = None) -> torch.Tensor:
        if state is None:
            return super().forward(F.pad(x, (self.left, 0)))
        history = state.get(self)
        if history is None:
            history = x.new_zeros(x.shape[0], x.shape[1], self.left)
        x = torch.cat([history, x], dim=2)
        state[self] = x[:, :, x.shape[2] - self.left :]
        return super().forward(x)


class CausalBlock(nn.Module):
    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.conv1 = CausalConv(channels, channels, 3, dilation)
        self.conv2 = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor, state: ConvState | None = None) -> torch.Tensor:
        return x + self.conv2(F.gelu(self.conv1(F.gelu(x), state)))


class CodecEncoder(nn.Module):
    """WORLD features (B, D, T_world) -> unquantised latents (B, fsq_dim, T_world / frames_per_code)."""

    def __init__(self, config: CodecConfig, fsq_dim: int):
        super().__init__()
        c = config.channels
        self.net = nn.Sequential(
            nn.Conv1d(world.FEATURE_DIM, c, 5, padding=2), nn.GELU(),
            nn.Conv1d(c, c, 3, padding=1), nn.GELU(),
            nn.Conv1d(c, c, config.frames_per_code, stride=config.frames_per_code), nn.GELU(),
            nn.Conv1d(c, c, 3, padding=1), nn.GELU(),
            nn.Conv1d(c, fsq_dim, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CodecDecoder(nn.Module):
    """Quantised latents (B, fsq_dim, T) -> WORLD features (B, D, T * frames_per_code); causal throughout."""

    def __init__(self, config: CodecConfig, fsq_dim: int):
        super().__init__()
        c, r = config.decoder_channels or config.channels, config.frames_per_code
        self.r = r
        self.inp = CausalConv(fsq_dim, c, 3)
        self.blocks = nn.Sequential(*[CausalBlock(c, 2**i) for i in range(config.decoder_blocks)])
        self.up = nn.Conv1d(c, c * r, 1)  # one codec frame -> r WORLD frames
        self.fine = nn.Sequential(CausalBlock(c, 1), CausalBlock(c, 2))
        self.out = nn.Conv1d(c, world.FEATURE_DIM, 1)

    def forward(self, q: torch.Tensor, state: ConvState | None = None) -> torch.Tensor:
        """state: a dict kept across calls streams the decoder (bounded: each conv keeps (kernel-1)*dilation frames)."""
        x = self.inp(q, state)
        for block in self.blocks:
            x = block(x, state)
        B, C, T = x.shape
        x = self.up(x).view(B, C, self.r, T).permute(0, 1, 3, 2).reshape(B, C, T * self.r)
        for block in self.fine:
            x = block(x, state)
        return self.out(x)


class FeatureCodec(nn.Module):
    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config
        self.fsq = FSQ(config.levels, config.num_codebooks)
        self.encoder = CodecEncoder(config, self.fsq.dim)
        self.decoder = CodecDecoder(config, self.fsq.dim)
        self.register_buffer("feature_mean", torch.zeros(world.FEATURE_DIM))
        self.register_buffer("feature_std", torch.ones(world.FEATURE_DIM))

    def spectrum_weights(self) -> torch.Tensor | None:
        if self.config.spectrum_weighting == "uniform":
            return None
        if self.config.spectrum_weighting == "low_order":
            order = torch.arange(world.SP_DIMS, dtype=torch.float32)
            weights = torch.cat([1 + self.config.low_order_boost * torch.exp(-order / 6), torch.ones(world.AP_DIMS)])
        else:
            weights = self.feature_std[2:] ** 2
        return weights / weights.mean()

    def normalize(self, features: torch.Tensor) -> torch.Tensor:
        """(B, T, D) raw -> (B, D, T) normalised"""
        return ((features - self.feature_mean) / self.feature_std).transpose(1, 2)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """(B, D, T) decoder output -> (B, T, D) raw features (voicing as a 0/1 flag)"""
        features = x.transpose(1, 2) * self.feature_std + self.feature_mean
        voiced = (x[:, 1] > 0).float()  # the voicing channel is a logit
        return torch.cat([features[..., :1], voiced.unsqueeze(-1), features[..., 2:]], dim=-1)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training: (B, T, D) raw features (T a multiple of frames_per_code) -> decoder output (B, D, T) and
        the normalised target (B, D, T)."""
        target = self.normalize(features)
        return self.decoder(self.fsq.quantize(self.encoder(target))), target


def codec_loss(
    output: torch.Tensor, target: torch.Tensor, features: torch.Tensor, spectrum_weights: torch.Tensor | None = None,
    delta_weight: float = 0.0,
) -> dict[str, torch.Tensor]:
    """MSE on normalised log F0 (voiced frames), spectral envelope and aperiodicity (optionally weighted per
    dimension, weights averaging 1); BCE on voicing; optionally MSE on the envelope's frame-to-frame change (an MSE
    fit alone smooths transitions)."""
    voiced = features[..., 1]  # (B, T) 0/1
    f0 = ((output[:, 0] - target[:, 0]) ** 2 * voiced).sum() / voiced.sum().clamp(min=1)
    vuv = F.binary_cross_entropy_with_logits(output[:, 1], voiced)
    squared = (output[:, 2:] - target[:, 2:]) ** 2  # (B, D-2, T)
    spectrum = (squared * spectrum_weights.view(1, -1, 1)).mean() if spectrum_weights is not None else squared.mean()
    total = 2.0 * f0 + vuv + spectrum
    losses = {"f0": f0, "vuv": vuv, "spectrum": spectrum}
    if delta_weight:
        delta = (output[:, 2:, 1:] - output[:, 2:, :-1]) - (target[:, 2:, 1:] - target[:, 2:, :-1])
        losses["delta"] = (delta**2).mean()
        total = total + delta_weight * losses["delta"]
    return {"total": total, **losses}


# ---- the codec interface ----------------------------------------------------------------------------------------
class BuiltinCodec:
    """sample_rate, frame_rate, num_codebooks, codebook_size, encode(wav) -> [K, T], decode(codes) -> wav,
    streaming_decoder() -> StreamingCodecDecoder."""

    def __init__(self, model: FeatureCodec):
        self.model = model.eval()
        self.config = model.config
        self.sample_rate = world.SAMPLE_RATE
        self.frame_rate = self.config.frame_rate
        self.num_codebooks = self.config.num_codebooks
        self.codebook_size = self.config.codebook_size
        self.samples_per_frame = self.config.samples_per_frame

    @classmethod
    def load(cls, directory: Path | str | None = None) -> "BuiltinCodec":
        from safetensors.torch import load_file

        directory = Path(directory) if directory else DEFAULT_CODEC_DIR
        if not (directory / "codec.safetensors").exists():
            raise UserError(f"no codec weights in {directory} (train them with `s5 codec train`)")
        config = CodecConfig(**json.loads((directory / "codec.json").read_text()))
        model = FeatureCodec(config)
        state = {k: v.float() for k, v in load_file(directory / "codec.safetensors").items()}
        model.load_state_dict(state)
        return cls(model)

    def save(self, directory: Path) -> None:
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        (directory / "codec.json").write_text(json.dumps(asdict(self.config), indent=1))
        save_file({k: v.half().contiguous() for k, v in self.model.state_dict().items()}, directory / "codec.safetensors")

    def pad_features(self, features: np.ndarray) -> np.ndarray:
        r = self.config.frames_per_code
        T = math.ceil(len(features) / r) * r
        return np.concatenate([features, np.repeat(features[-1:], T - len(features), axis=0)]) if T > len(features) else features

    @torch.no_grad()
    def encode_features(self, features: np.ndarray) -> torch.Tensor:
        """(T_world, D) -> (K, T) codes"""
        x = self.model.normalize(torch.from_numpy(self.pad_features(features)).float()[None])
        return self.model.fsq.to_codes(self.model.fsq.quantize(self.model.encoder(x)))[0]

    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """float audio at 22.05 kHz -> (K, T) codes"""
        return self.encode_features(world.analyze(audio))

    @torch.no_grad()
    def decode_features(self, codes: torch.Tensor, state: ConvState | None = None) -> np.ndarray:
        """(K, T) -> (T * frames_per_code, D) WORLD features; pass the same state dict chunk after chunk to stream"""
        out = self.model.decoder(self.model.fsq.from_codes(codes[None].long()), state)
        return self.model.denormalize(out)[0].numpy()

    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """(K, T) codes -> float32 audio of T * samples_per_frame samples"""
        return world.synthesize(self.decode_features(codes))

    def streaming_decoder(self, crossfade_frames: int = 2) -> "StreamingCodecDecoder":
        return StreamingCodecDecoder(self, crossfade_frames)


class CrossfadeJoiner:
    """Joins audio rendered window by window: the newest `hold` samples of each window wait for the next one,
    which renders them again with right context, and the two renderings are Hann-crossfaded."""

    def __init__(self, hold: int):
        self.hold = hold
        self.held = np.zeros(0, dtype=np.float32)

    def join(self, audio: np.ndarray, begin: int) -> np.ndarray:
        """audio: a rendering whose samples from `begin` on are new and whose len(held) samples before `begin`
        re-render the held ones (begin >= len(held)). Returns what may be played now."""
        n = len(self.held)
        if n:
            fade_in = np.sin(0.5 * np.pi * (np.arange(n) + 0.5) / n) ** 2
            audio[begin - n : begin] = self.held * (1 - fade_in) + audio[begin - n : begin] * fade_in
        out = audio[begin - n :]
        keep = min(self.hold, len(out))
        self.held = out[len(out) - keep :].copy()
        return out[: len(out) - keep].astype(np.float32)

    def flush(self) -> np.ndarray:
        out, self.held = self.held, np.zeros(0, dtype=np.float32)
        return out


class StreamingCodecDecoder:
    """Per-utterance streaming decoder: code chunks in, audio out.

    The network streams with per-conv state (a bounded left context: no code is decoded twice, and its outputs
    equal the offline ones). WORLD synthesis renders each push over a short window: `lead_frames` of lead-in,
    the `crossfade_frames` held back last time, and the new frames. The newest `crossfade_frames` of audio,
    rendered without right context, are held back and Hann-crossfaded into their re-rendering by the next push
    (or emitted by `flush()`). Total length equals offline decoding: T codec frames -> T * samples_per_frame
    samples (unless a push asks for a stretch).

    WORLD starts its pulse train afresh at the start of every rendering, so windows rendered independently would
    crossfade pulse trains out of phase at every join (roughness: DNSMOS 2.27 against 2.44 offline on the test
    sentences). The decoder keeps the pulse train's phase across pushes instead (`world.continue_phase`): each
    window's pulses fall where the offline rendering's fall, and its audio matches the offline audio but for
    WORLD's noise, at a rendering cost of (lead + crossfade + new) / new frames."""

    def __init__(self, codec: BuiltinCodec, crossfade_frames: int = 2, lead_frames: int = 4):
        self.codec = codec
        self.conv_state: ConvState = {}
        self.crossfade_frames = crossfade_frames
        self.joiner = CrossfadeJoiner(crossfade_frames * world.HOP)
        # frame 0 of a window only sets the phase, and pulses reach 2 frames (FFT_SIZE / 2 samples) past it
        self.lead_frames = max(lead_frames, 2 + world.FFT_SIZE // (2 * world.HOP))
        self.frames = np.zeros((0, world.FEATURE_DIM), dtype=np.float32)  # the window kept for the next push
        self.at_start = True  # the window still starts at the utterance's first frame
        self.phase = 0.0  # the pulse train's accumulated phase (radians, mod 2 pi) at the window's first frame

    supports_stretch = True

    def push(self, codes: torch.Tensor, stretch: float = 1.0) -> np.ndarray:
        """(K, n) new codes -> audio ready to play (possibly empty). stretch > 1 renders them that much slower at
        the same pitch (WORLD features interpolated in time): the streaming engine's pacing."""
        if codes.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        new = self.codec.decode_features(codes, self.conv_state)
        if stretch != 1.0:
            new = world.time_stretch(new, stretch, self.frames[-1] if len(self.frames) else None)
        begin = len(self.frames)
        frames = np.concatenate([self.frames, new])
        window = frames
        if not self.at_start:
            window = world.continue_phase(frames, self.phase + world.pulse_phase_steps(frames[:2])[0])
        out = self.joiner.join(world.synthesize(window), begin * world.HOP)
        drop = max(0, len(frames) - (self.lead_frames + self.crossfade_frames))  # slide the window
        if drop:
            self.phase = float((self.phase + world.pulse_phase_steps(frames[: drop + 1]).sum()) % (2 * np.pi))
            self.at_start = False
        self.frames = frames[drop:]
        return out

    def flush(self) -> np.ndarray:
        """The held samples, at the end of the utterance (they already had all the right context there is)."""
        return self.joiner.flush()


DEFAULT_CODEC_DIR = ASSETS / "codec"
