"""NeMo codec adapter (optional extra `nemo`): a NeMo `AudioCodecModel` behind the same codec interface as the
built-in codec. Weights come from a `.nemo` file or a pretrained name the user already has; nothing is
downloaded here."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from audio_io.errors import UserError


class NemoCodec:
    """sample_rate, frame_rate, num_codebooks, codebook_size, encode(wav) -> [K, T], decode(codes) -> wav,
    streaming_decoder()."""

    def __init__(self, model):
        self.model = model.eval()
        self.sample_rate = int(model.sample_rate)
        self.samples_per_frame = int(model.samples_per_frame)
        self.frame_rate = self.sample_rate / self.samples_per_frame
        self.num_codebooks = int(model.num_codebooks)
        self.codebook_size = int(model.codebook_size)

    @classmethod
    def load(cls, name_or_path: str | Path) -> "NemoCodec":
        try:
            from nemo.collections.tts.models import AudioCodecModel
        except ImportError as error:
            raise UserError("the NeMo codec needs the nemo extra: pip install -e '.[nemo]'") from error
        path = Path(name_or_path)
        if path.suffix == ".nemo":
            if not path.exists():
                raise UserError(f"no NeMo codec at {path}")
            return cls(AudioCodecModel.restore_from(str(path), map_location="cpu"))
        return cls(AudioCodecModel.from_pretrained(str(name_or_path), map_location="cpu"))

    @torch.no_grad()
    def encode(self, audio: np.ndarray) -> torch.Tensor:
        """float audio at sample_rate -> (K, T) codes"""
        x = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))[None]
        tokens, _ = self.model.encode(audio=x, audio_len=torch.tensor([x.shape[1]]))
        return tokens[0].long()

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """(K, T) codes -> float32 audio of T * samples_per_frame samples"""
        audio, _ = self.model.decode(tokens=codes[None].long(), tokens_len=torch.tensor([codes.shape[1]]))
        return audio[0, : codes.shape[1] * self.samples_per_frame].float().numpy()

    def streaming_decoder(self, context_frames: int = 8, crossfade_frames: int = 1) -> WindowedStreamingDecoder:
        return WindowedStreamingDecoder(self, context_frames, crossfade_frames)


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


class WindowedStreamingDecoder:
    """Streaming for any codec with decode(codes) -> audio: each push decodes the new codes with a bounded window
    of earlier codes as context (the prefix is never re-decoded as a whole); the newest `crossfade_frames` of
    audio are held back and Hann-crossfaded into their re-decoding with right context on the next push. It renders
    audio straight from codes, so it cannot stretch (pacing is off with it)."""

    supports_stretch = False

    def __init__(self, codec, context_frames: int, crossfade_frames: int):
        assert context_frames >= crossfade_frames
        self.codec = codec
        self.context_frames = context_frames
        self.joiner = CrossfadeJoiner(crossfade_frames * codec.samples_per_frame)
        self.codes = torch.zeros(codec.num_codebooks, 0, dtype=torch.long)

    def push(self, codes: torch.Tensor, stretch: float = 1.0) -> np.ndarray:
        if codes.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        context = self.codes[:, max(0, self.codes.shape[1] - self.context_frames) :]
        window = torch.cat([context, codes.long()], dim=1)
        self.codes = window[:, max(0, window.shape[1] - self.context_frames) :]
        return self.joiner.join(self.codec.decode(window), context.shape[1] * self.codec.samples_per_frame)

    def flush(self) -> np.ndarray:
        return self.joiner.flush()
