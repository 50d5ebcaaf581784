"""Per-codebook top-k / temperature sampling of codec frames, with BOS never and EOS only sometimes allowed."""
from __future__ import annotations

import torch


def mask_special_codes(logits: torch.Tensor, codebook_size: int, allow_eos: bool) -> torch.Tensor:
    """logits: (..., K, codebook_size + 2). BOS (index codebook_size) is never a valid output; EOS
    (codebook_size + 1) only where the caller allows it (while decoding the last word). Without EOS the codebook's
    own codes are the first `codebook_size`: a view of them, no copy (a decoder step samples every stream's frame
    on the worker thread, whose Python time bounds a server's sessions)."""
    if not allow_eos:
        return logits[..., :codebook_size]
    logits = logits.clone()
    logits[..., codebook_size] = float("-inf")
    return logits


def sample_codes(
    logits: torch.Tensor, top_k: int, temperature: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Sample one code per codebook. logits: (..., K, V) -> (..., K). top_k <= 1 or temperature <= 0 is argmax."""
    if top_k <= 1 or temperature <= 0:
        return logits.argmax(-1)
    top_k = min(top_k, logits.shape[-1])
    values, indices = logits.topk(top_k, dim=-1)  # (..., K, top_k)
    probs = (values / temperature).softmax(-1)
    flat = probs.reshape(-1, top_k)
    choice = torch.multinomial(flat, 1, generator=generator).view(*probs.shape[:-1], 1)
    return indices.gather(-1, choice).squeeze(-1)
