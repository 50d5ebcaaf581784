"""Conv auxiliary attention (paper section 2.2.3): aligns decoder frames to phonemes during training, and the
reference prompt's frames at inference. It is never on the generation path, so its convs may look both ways."""
from __future__ import annotations

import torch
import torch.nn as nn


def _conv_stack(d_in: int, channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv1d(d_in, channels, 3, padding=1), nn.ReLU(), nn.Conv1d(channels, channels, 1))


class ConvAuxAttention(nn.Module):
    def __init__(self, d_model: int, channels: int, delta: float):
        super().__init__()
        self.text_proj = _conv_stack(d_model, channels)
        self.audio_proj = _conv_stack(d_model, channels)
        self.delta = delta

    def forward(
        self, text_emb: torch.Tensor, text_mask: torch.Tensor, audio_emb: torch.Tensor, log_prior: torch.Tensor | None
    ) -> torch.Tensor:
        """text_emb: (B, T, C) phoneme embeddings; text_mask: (B, T) real tokens; audio_emb: (B, S, C) frame
        embeddings; log_prior: (B, S, T) or None. Returns log P(t | s) + log prior: (B, S, T), -inf on padding."""
        keys = self.text_proj(text_emb.transpose(1, 2)).transpose(1, 2)  # (B, T, ch)
        queries = self.audio_proj(audio_emb.transpose(1, 2)).transpose(1, 2)  # (B, S, ch)
        # ||q - k||^2 expanded, so no (B, S, T, ch) tensor is built
        dist = queries.pow(2).sum(-1, keepdim=True) + keys.pow(2).sum(-1).unsqueeze(1) - 2 * queries @ keys.transpose(1, 2)
        scores = (-self.delta * dist).masked_fill(~text_mask.unsqueeze(1), float("-inf"))
        log_probs = scores.log_softmax(-1)
        if log_prior is not None:
            log_probs = log_probs + log_prior
        return log_probs
