"""Lookahead-causal masks as pure functions (`docs/architecture.md`, section 3).

Conventions: word ids are 1-based, 0 marks padding; a mask is a bool tensor where True means "may attend".
`k=None` is full context (T5-TTS).

Stacking M_enc in every encoder layer would widen the receptive field to (layers x k) words, so the encoder
spends its lookahead once: the word-causal layers use M_enc with k=0 and only the last layer uses k. The last
layer is evaluated once per horizon j = 0..k (M_enc with k=j): version j of word m is exactly what streaming
inference can compute when words up to m+j have arrived. The decoder then picks, per step and per token, the
version that matches its own horizon A(s)+k, so training sees what streaming inference sees.
"""
from __future__ import annotations

import torch


def encoder_mask(word_ids: torch.Tensor, k: int | None) -> torch.Tensor:
    """M_enc(t, t') = 1 iff w(t') <= w(t) + k, restricted to real (non-padding) keys.

    word_ids: (..., T) -> (..., T, T)
    """
    key_valid = (word_ids > 0).unsqueeze(-2)  # (..., 1, T)
    if k is None:
        return key_valid.expand(*word_ids.shape, word_ids.shape[-1])
    return (word_ids.unsqueeze(-2) <= word_ids.unsqueeze(-1) + k) & key_valid


def decoder_mask(word_ids: torch.Tensor, step_words: torch.Tensor, k: int | None) -> torch.Tensor:
    """M_dec(s, t) = 1 iff w(t) <= A(s) + k, restricted to real keys.

    word_ids: (..., T), step_words A(s): (..., S) -> (..., S, T)
    """
    key_valid = (word_ids > 0).unsqueeze(-2)  # (..., 1, T)
    if k is None:
        return key_valid.expand(*step_words.shape, word_ids.shape[-1])
    return (word_ids.unsqueeze(-2) <= step_words.unsqueeze(-1) + k) & key_valid


def causal_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """Decoder self-attention: step s sees steps <= s. -> (S, S)"""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def num_horizon_versions(k: int | None) -> int:
    """How many horizon versions of each encoder output exist: k+1 in S5 mode, 1 in T5 mode."""
    return 1 if k is None else k + 1


def active_version(slot_words: torch.Tensor, step_words: torch.Tensor, k: int | None) -> torch.Tensor:
    """Which horizon version of a token decoder step s reads: min(A(s) + k - w(t), k) (0 in T5 mode).

    slot_words: (..., T), step_words: (..., S) -> (..., S, T); negative where M_dec forbids the token.
    """
    if k is None:
        return torch.zeros(*step_words.shape, slot_words.shape[-1], dtype=torch.long, device=step_words.device)
    return (step_words.unsqueeze(-1) + k - slot_words.unsqueeze(-2)).clamp(max=k)


def cross_slot_mask(
    slot_words: torch.Tensor, slot_versions: torch.Tensor, step_words: torch.Tensor, k: int | None
) -> torch.Tensor:
    """M_dec over horizon-versioned memory slots: slot (t, j) is visible at step s iff M_dec(s, t) and j is the
    version matching the step's horizon.

    slot_words, slot_versions: (..., L), step_words: (..., S) -> (..., S, L)
    """
    visible = decoder_mask(slot_words, step_words, k)
    return visible & (slot_versions.unsqueeze(-2) == active_version(slot_words, step_words, k))
