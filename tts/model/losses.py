"""Training loss assembly: codebook cross-entropy (prompt frames excluded) plus the two alignment losses."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from tts.model.alignment import forward_sum_loss

if TYPE_CHECKING:
    from tts.model.batch import Memory


@dataclass
class LossWeights:
    ce: float = 1.0
    aux: float = 1.0
    cross_ctc: float = 0.1


class LossTerms:
    """A training step's loss terms (tensor fields): logged as floats."""

    def as_floats(self) -> dict[str, float]:
        return {name: float(value.detach()) for name, value in vars(self).items()}


@dataclass
class TrainingLosses(LossTerms):
    total: torch.Tensor
    ce: torch.Tensor
    aux: torch.Tensor
    cross_ctc: torch.Tensor


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values (B, S, ...) averaged over positions where mask (B, S) is set (and every trailing element)."""
    weight = mask.float().view(*mask.shape, *([1] * (values.dim() - 2)))
    return (values * weight).sum() / (weight.sum() * values[0, 0].numel()).clamp(min=1)


def codebook_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean CE over codebooks and masked positions. logits: (B, S, K, V); targets: (B, K, S); mask: (B, S)"""
    per_token = F.cross_entropy(logits.permute(0, 3, 1, 2), targets.transpose(1, 2), reduction="none")  # (B, S, K)
    return masked_mean(per_token, mask)


def slot_scores_to_tokens(slot_scores: torch.Tensor, memory: "Memory", num_tokens: int) -> torch.Tensor:
    """Cross-attention logits over memory slots (B, S, L) -> over tokens (B, S, T). A step sees at most one
    version of each token, so the max over a token's slots picks it (and stays -inf where M_dec forbids)."""
    B, S, L = slot_scores.shape
    out = slot_scores.new_full((B, S, num_tokens), float("-inf"))
    index = memory.tokens[:, None, :].expand(B, S, L)
    return out.scatter_reduce(2, index, slot_scores, reduce="amax", include_self=True)


def assemble_losses(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor, aux_log_probs: torch.Tensor,
    cross_scores: torch.Tensor, memory: "Memory", text_lens: torch.Tensor, code_lens: torch.Tensor,
    weights: LossWeights,
) -> TrainingLosses:
    ce = codebook_cross_entropy(logits, targets, loss_mask)
    aux = forward_sum_loss(aux_log_probs, text_lens, code_lens)
    cross = forward_sum_loss(slot_scores_to_tokens(cross_scores, memory, aux_log_probs.shape[2]), text_lens, code_lens)
    total = weights.ce * ce + weights.aux * aux + weights.cross_ctc * cross
    return TrainingLosses(total, ce, aux, cross)
