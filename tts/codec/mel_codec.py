"""The mel codec, the paper's kind (seed 001: NeMo's FSQ mel codec): 8 FSQ codebooks over log-mel frames, decoded
back to log-mel and voiced by a vocoder (the shipped codec names "fast", the iSTFT one in `tts/assets/vocoder`;
"universal", HiFi-GAN V1, is more natural and costs about 40 times more: `tts/codec/vocoder.py`).

encode: audio -> log-mel (86.13 frames/s) -> conv encoder, `stack` mel frames per codec frame -> 8 groups of FSQ
        scalars -> [K, T] codes (the encoder sees the whole utterance: it only runs offline, on the corpus)
decode: codes -> streaming conv decoder (`decoder_lookahead` codec frames of lookahead, then causal) -> log-mel -> vocoder
Every decoder convolution streams with exact results (`streaming_conv`), and so does the vocoder: streamed audio
equals offline audio, with no re-rendering and no crossfade at chunk joins.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from tts.codec import mel
from tts.codec.fsq import FSQ
from tts.codec.streaming_conv import (
    StreamConv1d,
    StreamConvTranspose1d,
    StreamState,
    aligned_sum,
    split_state,
    stack_states,
    state_signature,
)
from audio_io.errors import UserError
from tts.codec.base import held_back_frames
from tts.codec.vocoder import UNIVERSAL, Vocoder, generate_in_push_lengths, load_vocoder
from tts.codec.vocoder_choice import (
    AUTO,
    CANDIDATES,
    CODEC_ONLY_STEP_S,
    VocoderTiming,
    choose,
    describe,
    named_warning,
    read_cached,
    time_renders,
    write_cached,
)


@dataclass
class MelCodecConfig:
    kind: str = "mel"
    stack: int = 4  # mel frames per codec frame (a power of 2): 4 -> 21.5 frames/s, 2 -> 43, 1 -> 86
    num_codebooks: int = 8
    levels: list[int] = field(default_factory=lambda: [8, 5, 5, 5])  # FSQ levels per codebook: 1000 codes
    channels: int = 256
    decoder_lookahead: int = 1  # codec frames the decoder's input conv sees ahead (0: causal, 46 ms less held back)
    vocoder: str = UNIVERSAL  # "universal" (HiFi-GAN V1), "fast" (iSTFT), "auto" (`choose_auto`) or a folder

    @property
    def codebook_size(self) -> int:
        return math.prod(self.levels)

    @property
    def frame_rate(self) -> float:
        return mel.FRAME_RATE / self.stack

    @property
    def samples_per_frame(self) -> int:
        return mel.HOP * self.stack


class ResUnit(nn.Module):
    """x + conv1x1(gelu(conv_k3_dilated(gelu(x)))); right=0 makes it causal, None symmetric."""

    def __init__(self, channels: int, dilation: int, right: int | None):
        super().__init__()
        self.conv1 = StreamConv1d(channels, channels, 3, dilation, right=right)
        self.conv2 = StreamConv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor, state: StreamState | None = None, final: bool = True) -> torch.Tensor:
        branch = self.conv2(F.gelu(self.conv1(F.gelu(x), state, final)), state, final)
        return aligned_sum([branch, x], state, self)


class MelEncoder(nn.Module):
    """Normalised log-mel (B, 80, T) -> latents (B, fsq_dim, T / stack); offline only."""

    def __init__(self, config: MelCodecConfig, fsq_dim: int):
        super().__init__()
        c = config.channels
        self.inp = StreamConv1d(mel.N_MELS, c, 5)
        self.units = nn.ModuleList([ResUnit(c, d, None) for d in (1, 2, 4)])
        self.downs = nn.ModuleList([nn.Conv1d(c, c, 4, stride=2, padding=1) for _ in range(int(math.log2(config.stack)))])
        self.down_units = nn.ModuleList([ResUnit(c, 1, None) for _ in self.downs])
        self.out = nn.Conv1d(c, fsq_dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for unit in self.units:
            x = unit(x)
        for down, unit in zip(self.downs, self.down_units):
            x = unit(F.gelu(down(x)))
        return self.out(F.gelu(x))


class MelDecoder(nn.Module):
    """Quantised latents (B, fsq_dim, T) -> normalised log-mel (B, 80, T * stack); streams (see module doc)."""

    def __init__(self, config: MelCodecConfig, fsq_dim: int):
        super().__init__()
        c = config.channels
        ahead = config.decoder_lookahead  # 1: a centred kernel of 3; 0: a causal one (two frames of history)
        self.inp = StreamConv1d(fsq_dim, c, 1 + 2 * max(ahead, 1), right=ahead)
        self.units = nn.ModuleList([ResUnit(c, d, 0) for d in (1, 2, 4)])
        self.ups = nn.ModuleList([StreamConvTranspose1d(c, c, 4, 2, 1) for _ in range(int(math.log2(config.stack)))])
        self.up_units = nn.ModuleList([ResUnit(c, 1, 0) for _ in self.ups])
        self.out = StreamConv1d(c, mel.N_MELS, 1)

    def forward(self, q: torch.Tensor, state: StreamState | None = None, final: bool = True) -> torch.Tensor:
        x = self.inp(q, state, final)
        for unit in self.units:
            x = unit(x, state, final)
        for up, unit in zip(self.ups, self.up_units):
            x = unit(up(F.gelu(x), state, final), state, final)
        return self.out(F.gelu(x), state, final)


class MelCodecModel(nn.Module):
    def __init__(self, config: MelCodecConfig):
        super().__init__()
        self.config = config
        self.fsq = FSQ(config.levels, config.num_codebooks)
        self.encoder = MelEncoder(config, self.fsq.dim)
        self.decoder = MelDecoder(config, self.fsq.dim)
        self.register_buffer("mel_mean", torch.zeros(mel.N_MELS))
        self.register_buffer("mel_std", torch.ones(mel.N_MELS))

    def normalize(self, log_mel: torch.Tensor) -> torch.Tensor:
        """(B, T, 80) -> (B, 80, T)"""
        return ((log_mel - self.mel_mean) / self.mel_std).transpose(1, 2)

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 80, T) -> (B, T, 80)"""
        return x.transpose(1, 2) * self.mel_std + self.mel_mean

    def forward(self, log_mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training: (B, T, 80) log-mel (T a multiple of stack) -> decoded and target, both normalised (B, 80, T)."""
        target = self.normalize(log_mel)
        return self.decoder(self.fsq.quantize(self.encoder(target))), target


def mel_codec_loss(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """L1 on normalised log-mel (the feasibility run's loss), and the MSE for reference."""
    l1 = (output - target).abs().mean()
    return {"total": l1, "l1": l1, "mse": ((output - target) ** 2).mean().detach()}


class MelCodec:
    """sample_rate, frame_rate, num_codebooks, codebook_size, samples_per_frame; analyze(wav) -> log-mel,
    encode(wav) -> [K, T], decode(codes) -> wav, streaming_decoder()."""

    def __init__(self, model: MelCodecModel, vocoder: Vocoder | None = None):
        self.model = model.eval()
        self.config = model.config
        self._vocoder = vocoder
        self.auto_choice: str | None = None  # what "auto" chose and why, once it has
        self.named_warning: str | None = None  # a vocoder named by the user that this machine cannot keep live
        self.sample_rate = mel.SAMPLE_RATE
        self.frame_rate = self.config.frame_rate
        self.num_codebooks = self.config.num_codebooks
        self.codebook_size = self.config.codebook_size
        self.samples_per_frame = self.config.samples_per_frame

    @property
    def vocoder(self) -> Vocoder:
        """Loaded on first use (training and encoding never need it); "auto" is chosen then (`choose_auto`)."""
        if self._vocoder is None:
            self.use_vocoder(self.config.vocoder)
        return self._vocoder

    def use_vocoder(self, name: str, step_s: float | None = None) -> None:
        """Voice this codec with another vocoder ("universal", "fast", "auto" or a folder). For "auto" a caller
        that knows its model's decoder step passes it (`tts/inference/streaming.py`)."""
        if str(name) == AUTO:
            name, self.auto_choice = self.choose_auto(CODEC_ONLY_STEP_S if step_s is None else step_s)
        else:
            self.named_warning = named_warning(str(name))
        self.config = replace(self.config, vocoder=str(name))  # named as chosen, for every report
        self._vocoder = load_vocoder(self.config.vocoder)

    def choose_auto(self, step_s: float) -> tuple[str, str]:
        """(vocoder, why): the most natural candidate that meets the bars here (`tts/codec/vocoder_choice.py`),
        from the cached timings of this machine, timed now (and cached) when there are none."""
        timings = read_cached()
        measured = timings is None or [t.vocoder for t in timings] != list(CANDIDATES)
        if measured:
            timings = self.time_vocoders()
        if step_s != CODEC_ONLY_STEP_S:  # a model's measured step: `--show-settings` judges by it later
            write_cached(timings, step_s, self.frame_rate)
        elif measured:
            write_cached(timings)
        chosen, verdicts = choose(timings, step_s, self.frame_rate)
        return chosen, describe(chosen, verdicts)

    def time_vocoders(self) -> list[VocoderTiming]:
        """Each `auto` candidate's render costs through this codec's streaming decoder."""
        timings = []
        for name in CANDIDATES:
            voiced = MelCodec(self.model, load_vocoder(name))
            timings.append(time_renders(name, voiced.streaming_decoder, self.num_codebooks, self.frame_rate,
                                        held_back_frames(voiced)))
        return timings

    @classmethod
    def load(cls, directory: Path | str) -> "MelCodec":
        from safetensors.torch import load_file

        directory = Path(directory)
        if not (directory / "codec.safetensors").exists():
            raise UserError(f"no codec weights in {directory} (train them with `s5 codec train`)")
        config = MelCodecConfig(**json.loads((directory / "codec.json").read_text()))
        model = MelCodecModel(config)
        model.load_state_dict({k: v.float() for k, v in load_file(directory / "codec.safetensors").items()})
        return cls(model)

    def save(self, directory: Path) -> None:
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        (directory / "codec.json").write_text(json.dumps(asdict(self.config), indent=1))
        save_file({k: v.half().contiguous() for k, v in self.model.state_dict().items()}, directory / "codec.safetensors")

    analyze = staticmethod(mel.log_mel)

    def pad_frames(self, log_mel: np.ndarray) -> np.ndarray:
        """Pad with silence to a whole number of codec frames."""
        T = math.ceil(len(log_mel) / self.config.stack) * self.config.stack
        return np.concatenate([log_mel, np.full((T - len(log_mel), mel.N_MELS), mel.LOG_FLOOR, np.float32)])

    @torch.no_grad()
    def encode_features(self, log_mel: np.ndarray) -> torch.Tensor:
        """(T_mel, 80) -> (K, ceil(T_mel / stack)) codes"""
        x = self.model.normalize(torch.from_numpy(self.pad_frames(log_mel)).float()[None])
        return self.model.fsq.to_codes(self.model.fsq.quantize(self.model.encoder(x)))[0]

    def encode(self, audio: np.ndarray) -> torch.Tensor:
        return self.encode_features(mel.log_mel(audio))

    @torch.no_grad()
    def decode_features(self, codes: torch.Tensor, state: StreamState | None = None, final: bool = True) -> np.ndarray:
        """(K, T) -> (T * stack, 80) log-mel offline; streaming (a state dict, final=False until the last call) it
        returns the frames that are final so far."""
        out = self.model.decoder(self.model.fsq.from_codes(codes[None].long()), state, final)
        return self.model.denormalize(out)[0].numpy()

    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """(K, T) codes -> float32 audio of T * samples_per_frame samples"""
        return self.vocoder(self.decode_features(codes))

    def streaming_decoder(self) -> "StreamingMelDecoder":
        return StreamingMelDecoder(self)


class StreamingMelDecoder:
    """Per-utterance: code chunks in, audio out; its concatenated output (pushes + flush) equals `decode` of all
    the codes. A push returns the audio whose right context has arrived; the rest waits for the next push or
    `flush()`. stretch > 1 renders the new frames that much slower (log-mel frames interpolated in time; the
    harmonics stay where they are, so the pitch does too): the streaming engine's pacing."""

    supports_stretch = True

    def __init__(self, codec: MelCodec):
        self.codec = codec
        self.conv_state: StreamState = {}
        self.vocoder_stream = codec.vocoder.streaming()
        self.last_frame: np.ndarray | None = None

    # A push runs as pushes of these lengths (codec frames, largest first), so that the decoder and the vocoder
    # meet a few input shapes, all compiled and cached at load (`TTSBundle.warm_up`): chunk sizes follow the
    # engine's timing, and a shape met first mid-reply costs a kernel compile there, a render spike that drains the
    # player. The convolutions stream exactly, so the split changes no sample.
    PUSH_LENGTHS = (16, 8, 4, 2, 1)

    def push(self, codes: torch.Tensor, stretch: float = 1.0) -> np.ndarray:
        """(K, n) new codes -> audio ready to play (possibly empty)."""
        if codes.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        parts, start = [], 0
        while start < codes.shape[1]:
            n = next(n for n in self.PUSH_LENGTHS if n <= codes.shape[1] - start)
            parts.append(self.codec.decode_features(codes[:, start : start + n], self.conv_state, final=False))
            start += n
        return self._vocode(np.concatenate(parts) if len(parts) > 1 else parts[0], stretch)

    def samples_for(self, frames: int, stretch: float = 1.0) -> int:
        """Samples of the stream that `frames` codes pushed at `stretch` become (some leave with later pushes)."""
        mel_frames = frames * self.codec.config.stack
        if stretch != 1.0 and mel_frames:
            mel_frames = max(1, round(mel_frames * stretch))
        return mel_frames * mel.HOP

    def flush(self) -> np.ndarray:
        empty = torch.zeros(self.codec.num_codebooks, 0, dtype=torch.long)
        frames = self.codec.decode_features(empty, self.conv_state, final=True)
        return np.concatenate([self._vocode(frames, 1.0), self.vocoder_stream.flush()])

    def _vocode(self, frames: np.ndarray, stretch: float) -> np.ndarray:
        if stretch != 1.0:
            frames = mel.time_stretch(frames, stretch, self.last_frame)
        if len(frames):
            self.last_frame = frames[-1]
        return self.vocoder_stream.push(frames)


@torch.inference_mode()
def render_many(streams: list[StreamingMelDecoder], codes: list[torch.Tensor],
                stretches: list[float]) -> list[np.ndarray]:
    """`stream.push(codes, stretch)` for several streams of one codec in few passes, each running the codec decoder
    and the vocoder once for every group of streams whose states stack (`stack_states`). A pass's cost is mostly
    fixed (the weights are read once whatever the frames), so the passes are planned to be few (`_plan`). The
    convolutions stream exactly, so how a push is cut changes no sample: each stream's audio is what its own push
    makes, up to float rounding. A stretched push, or another codec's stream, runs alone."""
    audio: list[np.ndarray | None] = [None] * len(streams)
    lengths: dict[int, int] = {}  # stream -> frames to push together
    for i, (stream, c) in enumerate(zip(streams, codes)):
        if type(stream) is StreamingMelDecoder and stretches[i] == 1.0 and c.shape[1]:
            lengths[i] = c.shape[1]
        else:
            audio[i] = stream.push(c, stretches[i]) if stretches[i] != 1.0 else stream.push(c)
    parts: dict[int, list[np.ndarray]] = {i: [] for i in lengths}
    for run in _plan(lengths):
        groups: dict[tuple, list[tuple[int, int, int]]] = {}
        for i, start, n in run:
            groups.setdefault(_stack_key(streams[i]), []).append((i, start, n))
        for members in groups.values():
            pieces = [codes[i][:, start : start + n] for i, start, n in members]
            for (i, _, _), piece_audio in zip(members, _push_together([streams[i] for i, _, _ in members], pieces)):
                parts[i].append(piece_audio)
    for i, heard in parts.items():
        audio[i] = np.concatenate(heard) if len(heard) > 1 else heard[0]
    return audio


@torch.inference_mode()
def flush_many(streams: list[StreamingMelDecoder]) -> list[np.ndarray]:
    """`stream.flush()` for several streams, one codec-decoder and two vocoder calls for every group whose states
    stack: a server's streams end a few at a time, and each flush alone runs every layer of both models for a few
    frames (a tenth of the render thread at 16 sessions, docs/results.md). Each stream's audio is its own flush's,
    up to float rounding."""
    audio: list[np.ndarray | None] = [None] * len(streams)
    groups: dict[tuple, list[int]] = {}
    for i, stream in enumerate(streams):
        if type(stream) is StreamingMelDecoder:
            groups.setdefault(_stack_key(stream), []).append(i)
        else:
            audio[i] = stream.flush()
    for members in groups.values():
        if len(members) == 1:
            audio[members[0]] = streams[members[0]].flush()
            continue
        group = [streams[i] for i in members]
        codec, vocoder = group[0].codec, group[0].vocoder_stream.vocoder
        state = stack_states([s.conv_state for s in group])
        empty = torch.zeros(len(group), codec.num_codebooks, 0, dtype=torch.long)
        mels = codec.model.denormalize(codec.model.decoder(codec.model.fsq.from_codes(empty), state, True))
        vocoder_state = stack_states([s.vocoder_stream.state for s in group])
        x = mels.transpose(1, 2).contiguous()  # (B, 80, frames the decoder held back)
        # as `StreamingMelDecoder.flush` runs it: the vocoder's push of those frames, then its flush
        out = torch.cat([generate_in_push_lengths(vocoder.generator, x, vocoder_state, False),
                         generate_in_push_lengths(vocoder.generator, x[:, :, :0], vocoder_state, True)], dim=1).numpy()
        rows = zip(members, group, out, split_state(state, len(group)), split_state(vocoder_state, len(group)))
        for i, stream, row_audio, row_state, row_vocoder_state in rows:
            stream.conv_state, stream.vocoder_stream.state = row_state, row_vocoder_state
            audio[i] = row_audio
    return audio


def _stack_key(stream: StreamingMelDecoder) -> tuple:
    """What streams share whose states stack into one batched call."""
    return (id(stream.codec), state_signature(stream.conv_state), id(stream.vocoder_stream.vocoder),
            state_signature(stream.vocoder_stream.state))


def _plan(lengths: dict[int, int]) -> list[list[tuple[int, int, int]]]:
    """The passes that push `lengths` (stream -> frames), each a list of (stream, first frame, frames) of one length:
    one pass per push length (four pushes of 12 frames: one pass), or rounds of one piece length
    (`StreamingMelDecoder.PUSH_LENGTHS`), each the length the most streams still have (pushes of 12 = 8 + 4, 8 and 4
    frames: two passes, not three), whichever is fewer."""
    by_length: dict[int, list[int]] = {}
    for i, n in lengths.items():
        by_length.setdefault(n, []).append(i)
    whole = [[(i, 0, n) for i in members] for n, members in by_length.items()]
    pieces = {i: _pieces(n) for i, n in lengths.items()}
    starts = dict.fromkeys(lengths, 0)
    rounds = []
    while any(pieces.values()):
        counts: dict[int, int] = {}
        for left in pieces.values():
            for n in set(left):
                counts[n] = counts.get(n, 0) + 1
        n = max(counts, key=lambda n: (counts[n], n))
        run = []
        for i, left in pieces.items():
            if n in left:
                left.remove(n)
                run.append((i, starts[i], n))
                starts[i] += n
        rounds.append(run)
    return rounds if len(rounds) < len(whole) else whole


def _pieces(frames: int) -> list[int]:
    """The lengths a push of `frames` runs as (`StreamingMelDecoder.PUSH_LENGTHS`, largest first)."""
    lengths = []
    while frames:
        lengths.append(next(n for n in StreamingMelDecoder.PUSH_LENGTHS if n <= frames))
        frames -= lengths[-1]
    return lengths


def _push_together(streams: list[StreamingMelDecoder], codes: list[torch.Tensor]) -> list[np.ndarray]:
    """One push each (equal lengths, stackable states), as `StreamingMelDecoder.push` runs it: the codec decoder in
    its pieces and the vocoder once, each for all of the streams at once."""
    if len(streams) == 1:
        return [streams[0].push(codes[0])]
    codec, vocoder = streams[0].codec, streams[0].vocoder_stream.vocoder
    state = stack_states([s.conv_state for s in streams])
    q = codec.model.fsq.from_codes(torch.stack(codes).long())  # (B, dim, n)
    decoded, start = [], 0
    for n in _pieces(q.shape[2]):
        decoded.append(codec.model.decoder(q[:, :, start : start + n], state, False))  # (B, 80, n * stack)
        start += n
    mels = codec.model.denormalize(torch.cat(decoded, dim=2) if len(decoded) > 1 else decoded[0])  # (B, n * stack, 80)
    for stream, row_state in zip(streams, split_state(state, len(streams))):
        stream.conv_state = row_state
    vocoder_state = stack_states([s.vocoder_stream.state for s in streams])
    out = vocoder.generator(mels.transpose(1, 2).contiguous(), vocoder_state, False)[:, 0].numpy()
    for stream, row_state, row_mel in zip(streams, split_state(vocoder_state, len(streams)), mels):
        stream.vocoder_stream.state = row_state
        if len(row_mel):  # a codec decoder with lookahead gives no frame for a stream's first piece
            stream.last_frame = row_mel[-1].numpy()
    return list(out)
