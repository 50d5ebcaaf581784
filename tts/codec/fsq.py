"""Finite scalar quantisation (Mentzer et al. 2023), as NeMo's FSQ codecs use it: no codebook to learn, each
code a mixed-radix number of bounded, rounded scalars."""
from __future__ import annotations

import torch
import torch.nn as nn


class FSQ(nn.Module):
    """Finite scalar quantisation: each of `groups` codebooks is len(levels) bounded scalars rounded to their
    levels; the code is their mixed-radix index."""

    def __init__(self, levels: list[int], groups: int):
        super().__init__()
        self.groups = groups
        self.register_buffer("levels", torch.tensor(levels), persistent=False)
        self.register_buffer("basis", torch.cumprod(torch.tensor([1] + levels[:-1]), 0), persistent=False)

    @property
    def dim(self) -> int:
        return self.groups * len(self.levels)

    def quantize(self, z: torch.Tensor) -> torch.Tensor:
        """(B, dim, T) unbounded -> (B, dim, T) quantised values in [-1, 1] (straight-through gradient)."""
        B, D, T = z.shape
        z = z.view(B, self.groups, -1, T)
        levels = self.levels.view(1, 1, -1, 1).float()
        half = (levels - 1) * (1 - 1e-3) / 2
        offset = torch.where(levels % 2 == 0, 0.5, 0.0)
        shift = torch.atanh(offset / half)
        bounded = torch.tanh(z + shift) * half - offset
        rounded = bounded + (bounded.round() - bounded).detach()
        return (rounded / (levels // 2)).view(B, D, T)

    def to_codes(self, q: torch.Tensor) -> torch.Tensor:
        """(B, dim, T) quantised -> (B, groups, T) ints"""
        B, D, T = q.shape
        levels = self.levels.view(1, 1, -1, 1)
        digits = (q.view(B, self.groups, -1, T) * (levels // 2) + levels // 2).round().long()
        return (digits * self.basis.view(1, 1, -1, 1)).sum(2)

    def from_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, groups, T) ints -> (B, dim, T) quantised values"""
        B, G, T = codes.shape
        levels = self.levels.view(1, 1, -1, 1)
        digits = (codes.unsqueeze(2) // self.basis.view(1, 1, -1, 1)) % levels
        return ((digits - levels // 2).float() / (levels // 2)).view(B, self.dim, T)
