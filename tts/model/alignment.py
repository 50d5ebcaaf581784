"""Alignment as small pure functions: beta-binomial prior, forward-sum (CTC) loss, monotonic alignment search
(MAS), and the word per decoder step A(s) derived from a hard alignment."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def beta_binomial_log_prior(
    frame_lens: torch.Tensor, text_lens: torch.Tensor, max_frames: int, max_text: int, scaling: float = 1.0
) -> torch.Tensor:
    """log P(t | s) of a beta-binomial over text positions whose mean walks down the diagonal (RAD-TTS prior).

    frame_lens, text_lens: (B,) -> (B, max_frames, max_text); padded cells are 0 (neutral when added).
    """
    device = frame_lens.device
    s = torch.arange(max_frames, device=device, dtype=torch.float32)[None, :, None]  # (1, S, 1)
    t = torch.arange(max_text, device=device, dtype=torch.float32)[None, None, :]  # (1, 1, T)
    S = frame_lens.float()[:, None, None]
    n = (text_lens.float() - 1).clamp(min=0)[:, None, None]
    a = scaling * (s + 1)
    b = scaling * (S - s).clamp(min=1)
    log_pmf = (
        torch.lgamma(n + 1) - torch.lgamma(t + 1) - torch.lgamma((n - t).clamp(min=0) + 1)
        + torch.lgamma(t + a) + torch.lgamma(n - t + b) - torch.lgamma(n + a + b)
        - (torch.lgamma(a) + torch.lgamma(b) - torch.lgamma(a + b))
    )
    valid = (s < S) & (t <= n)
    return torch.where(valid, log_pmf, torch.zeros_like(log_pmf))


def forward_sum_loss(
    scores: torch.Tensor, text_lens: torch.Tensor, frame_lens: torch.Tensor, blank_logprob: float = -1.0
) -> torch.Tensor:
    """Forward-sum loss (CTC with every text token as a label in order): the log-likelihood of all monotonic
    alignments of frames to text. scores: (B, S, T) unnormalised (log-)scores; -inf marks forbidden cells."""
    B, S, T = scores.shape
    text_valid = torch.arange(T, device=scores.device)[None, None, :] < text_lens[:, None, None]
    # a large finite floor instead of -inf: CTC's backward turns -inf - -inf into NaN
    scores = scores.clamp(min=-1e4).masked_fill(~text_valid, -1e4)
    scores = F.pad(scores, (1, 0), value=blank_logprob)  # column 0 is the CTC blank
    log_probs = scores.log_softmax(-1).transpose(0, 1)  # (S, B, T + 1)
    targets = torch.arange(1, T + 1, device=scores.device).expand(B, T)
    return F.ctc_loss(log_probs, targets, frame_lens, text_lens, blank=0, reduction="mean", zero_infinity=True)


def monotonic_alignment_search(log_p: np.ndarray, frame_lens: np.ndarray, text_lens: np.ndarray) -> np.ndarray:
    """Most likely monotonic path: every frame takes one token, tokens in order, every token >= 1 frame.

    log_p: (B, S, T) -> (B, S) int token index per frame (-1 on padding frames). A sample with fewer frames than
    tokens cannot cover every token; it gets the even split instead (token = floor(s * T / S)).
    """
    log_p = np.asarray(log_p, dtype=np.float64)
    B, S, T = log_p.shape
    frame_lens = np.asarray(frame_lens, dtype=np.int64)
    text_lens = np.asarray(text_lens, dtype=np.int64)
    neg = -1e30
    cols = np.arange(T)
    value = np.where(cols[None, :] == 0, log_p[:, 0, :], neg)  # (B, T): best path score ending at (s, t)
    moved = np.zeros((B, S, T), dtype=bool)  # True where the best path entered t from t-1
    for s in range(1, S):
        from_prev = np.concatenate([np.full((B, 1), neg), value[:, :-1]], axis=1)
        moved[:, s] = from_prev > value
        value = np.maximum(value, from_prev) + log_p[:, s, :]
        value = np.where(cols[None, :] <= s, value, neg)  # t > s is unreachable
    path = np.full((B, S), -1, dtype=np.int64)
    for b in range(B):
        n_frames, n_text = int(frame_lens[b]), int(text_lens[b])
        if n_frames < n_text:
            path[b, :n_frames] = (np.arange(n_frames) * n_text) // max(n_frames, 1)
            continue
        t = n_text - 1
        for s in range(n_frames - 1, -1, -1):
            path[b, s] = t
            if t > 0 and (moved[b, s, t] or t == s):
                t -= 1
    return path


def step_words_from_path(path: torch.Tensor, word_ids: torch.Tensor) -> torch.Tensor:
    """A(s): the word of the token each frame is aligned to. path: (B, S) token index (-1 pad), word_ids: (B, T)
    -> (B, S), 0 on padding frames."""
    words = word_ids.gather(1, path.clamp(min=0))
    return torch.where(path >= 0, words, torch.zeros_like(words))
