"""Transformer parts of S5-TTS, smallest first: positions, attention, feed-forward, encoder and decoder layers.

Every layer works on whole sequences for training and on new positions plus cached keys for streaming, with the
same weights and the same arithmetic, so the two paths agree to float precision.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def sinusoidal_positions(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """Fixed sinusoidal embedding of absolute positions: no learned table, so no length limit. (..., ) -> (..., dim)"""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions.float().unsqueeze(-1) * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """A bool mask (True = may attend) as what attention adds to its logits: 0 or -inf. A query row with nothing
    to attend to (a padding row) would give NaN; it sees everything instead (only padding rows are ever empty,
    and their outputs are never used)."""
    opened = mask | ~mask.any(dim=-1, keepdim=True)
    return torch.zeros(opened.shape, device=opened.device).masked_fill_(~opened, float("-inf"))


class Attention(nn.Module):
    """Multi-head attention with separate query and key/value projections, so keys can be projected once and
    cached (self-attention KV cache, append-only cross-attention memory)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.query = nn.Linear(d_model, d_model)
        self.key_value = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, C) -> keys, values (B, nh, T, hs)"""
        B, T, C = x.shape
        k, v = self.key_value(x).split(C, dim=-1)
        return (k.view(B, T, self.n_heads, self.head_dim).transpose(1, 2),
                v.view(B, T, self.n_heads, self.head_dim).transpose(1, 2))

    def attend(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
        bias: torch.Tensor | None = None, return_scores: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, S, C) queries; k, v: (B, nh, T, hs); mask: (B, S, T) or (S, T) bool, True = may attend, or its
        `additive_mask` (None: every key, as for the one new step of a decoder); bias: optional (B, S, T) added to
        the logits (attention prior). Returns (B, S, C) and, if asked, the masked logits (B, nh, S, T)."""
        y, scores = self.attend_heads(self.project_q(x), k, v, mask, bias, return_scores)
        return self.out(y), scores

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S, C) -> queries (B, nh, S, hs)"""
        B, S, _ = x.shape
        return self.query(x).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)

    def attend_heads(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
        bias: torch.Tensor | None = None, return_scores: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attend` after the query projection and before the output projection: q (B, nh, S, hs) -> the heads
        joined (B, S, C) and, if asked, the masked logits. A batch of utterances whose keys differ in length runs
        this per utterance and the projections around it once for all (`tts/model/incremental.decode_steps`, each
        step's keys only those it may read, unmasked); a mask used in every layer is best passed as `additive_mask`,
        made once."""
        B, _, S, _ = q.shape
        if mask is not None and mask.dtype == torch.bool:
            mask = additive_mask(mask)
        if mask is not None:
            mask = mask.to(q.dtype)
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)  # (B, 1, S, T)
        dropout = self.dropout if self.training else 0.0
        if not return_scores and bias is None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
            scores = None
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, nh, S, T)
            if bias is not None:
                scores = scores + bias.unsqueeze(1)
            if mask is not None:
                scores = scores + mask
            probs = scores.softmax(-1)
            y = (F.dropout(probs, dropout) if self.training else probs) @ v
        return y.transpose(1, 2).reshape(B, S, self.n_heads * self.head_dim), scores


class FeedForward(nn.Module):
    """Conv1d(kernel) -> GELU -> Linear. The conv is causal over the sequence (left padding only), so a token
    sees itself and earlier tokens: local context with no lookahead leak. kernel=1 is the plain MLP."""

    def __init__(self, d_model: int, d_ffn: int, kernel: int, dropout: float):
        super().__init__()
        self.kernel = kernel
        self.conv = nn.Conv1d(d_model, d_ffn, kernel)
        self.proj = nn.Linear(d_ffn, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, T, C); history: (B, kernel-1, C) inputs that precede x (zeros at the sequence start)."""
        if self.training and self.kernel > 1:
            h = torch.cat([self._history(x, history), x], dim=1)  # (B, kernel-1+T, C)
            return self.drop(self.proj(F.gelu(self.conv(h.transpose(1, 2)).transpose(1, 2))))
        return self.drop(self.from_windows(self.windows(x, history)))

    def windows(self, x: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """The convolution's input windows of x as rows: (B, T, C) -> (B, T, C * kernel), so that the convolution
        is one matrix product (`from_windows`; the CPU convolution costs ~1.3 ms on a few tokens), which streams
        that each bring their own history run once over all their rows (`tts/model/incremental.encode_many`)."""
        if self.kernel == 1:  # pointwise: the same weights as a linear layer
            return x
        B, T, C = x.shape
        h = torch.cat([self._history(x, history), x], dim=1)
        return h.unfold(1, self.kernel, 1).reshape(B, T, C * self.kernel)

    def from_windows(self, windows: torch.Tensor) -> torch.Tensor:
        """(..., C * kernel) rows of `windows` -> (..., C), without dropout."""
        weight = self.conv.weight.reshape(self.conv.out_channels, -1)
        return self.proj(F.gelu(F.linear(windows, weight, self.conv.bias)))

    def _history(self, x: torch.Tensor, history: torch.Tensor | None) -> torch.Tensor:
        return x.new_zeros(x.shape[0], self.kernel - 1, x.shape[2]) if history is None else history


class EncoderLayer(nn.Module):
    """Pre-norm self-attention + feed-forward over phoneme tokens. The caller passes the mask (M_enc)."""

    def __init__(self, d_model: int, n_heads: int, d_ffn: int, ffn_kernel: int, dropout: float):
        super().__init__()
        self.norm_attn = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads, dropout)
        self.norm_ffn = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ffn, ffn_kernel, dropout)
        self.drop = nn.Dropout(dropout)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values this layer's attention reads from inputs x: (B, T, C) -> 2 x (B, nh, T, hs)"""
        return self.attn.project_kv(self.norm_attn(x))

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        ffn_history: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, Tq, C) queries; mask: (B, Tq, T) or (Tq, T); kv: keys/values of the T visible tokens
        (default: x's own, T = Tq); ffn_history: FFN inputs of the kernel-1 tokens before x (streaming).
        Returns the outputs (B, Tq, C) and the FFN inputs (B, Tq, C) a later streaming call needs as history."""
        k, v = self.keys_values(x) if kv is None else kv
        x = x + self.drop(self.attn.attend(self.norm_attn(x), k, v, mask)[0])
        ffn_in = self.norm_ffn(x)
        return x + self.ffn(ffn_in, ffn_history), ffn_in


class KVCache:
    """Self-attention keys/values of one decoder layer for one utterance: a preallocated buffer that doubles when
    full, so appending a step copies nothing already cached."""

    def __init__(self, capacity: int = 256):
        self.capacity = capacity
        self.length = 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, nh, n, hs) and return views of everything cached so far."""
        n = k.shape[2]
        if self.k is None or self.length + n > self.k.shape[2]:
            capacity = max(self.capacity, 2 * (self.length + n))
            grown_k = k.new_zeros(*k.shape[:2], capacity, k.shape[3])
            grown_v = v.new_zeros(*v.shape[:2], capacity, v.shape[3])
            if self.k is not None:
                grown_k[:, :, : self.length] = self.k[:, :, : self.length]
                grown_v[:, :, : self.length] = self.v[:, :, : self.length]
            self.k, self.v = grown_k, grown_v
        self.k[:, :, self.length : self.length + n] = k
        self.v[:, :, self.length : self.length + n] = v
        self.length += n
        return self.k[:, :, : self.length], self.v[:, :, : self.length]


class DecoderLayer(nn.Module):
    """Pre-norm causal self-attention, cross-attention to the encoder memory slots, feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_ffn: int, dropout: float):
        super().__init__()
        self.norm_self = nn.LayerNorm(d_model)
        self.self_attn = Attention(d_model, n_heads, dropout)
        self.norm_cross = nn.LayerNorm(d_model)
        self.cross_attn = Attention(d_model, n_heads, dropout)
        self.norm_ffn = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ffn, 1, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, self_mask: torch.Tensor | None, cross_k: torch.Tensor, cross_v: torch.Tensor,
        cross_mask: torch.Tensor, cache: KVCache | None = None, cross_bias: torch.Tensor | None = None,
        return_scores: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, S, C) new decoder positions; self_mask: (S, S_cached + S), None for all; cross_k/v: (B, nh, L, hs)
        memory slots; cross_mask: (B, S, L). Returns (B, S, C) and, if asked, the cross-attention logits
        (B, nh, S, L)."""
        h = self.norm_self(x)
        k, v = self.self_attn.project_kv(h)
        if cache is not None:
            k, v = cache.extend(k, v)
        x = x + self.drop(self.self_attn.attend(h, k, v, self_mask)[0])
        y, scores = self.cross_attn.attend(self.norm_cross(x), cross_k, cross_v, cross_mask, cross_bias, return_scores)
        x = x + self.drop(y)
        return x + self.ffn(self.norm_ffn(x)), scores
