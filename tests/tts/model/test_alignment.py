import itertools

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tts.model.alignment import (
    beta_binomial_log_prior,
    forward_sum_loss,
    monotonic_alignment_search,
    step_words_from_path,
)


def _brute_force_best(log_p: np.ndarray) -> float:
    """Best score over all monotonic paths: start at token 0, end at the last, each token >= 1 frame."""
    S, T = log_p.shape
    best = -np.inf
    for cuts in itertools.combinations(range(1, S), T - 1):  # frames where the next token starts
        bounds = (0, *cuts, S)
        score = sum(log_p[bounds[i]:bounds[i + 1], i].sum() for i in range(T))
        best = max(best, score)
    return best


def _path_score(log_p: np.ndarray, path: np.ndarray) -> float:
    return float(sum(log_p[s, t] for s, t in enumerate(path)))


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 4), extra=st.integers(0, 4), seed=st.integers(0, 10_000))
def test_mas_equals_brute_force(T, extra, seed):
    S = T + extra
    rng = np.random.default_rng(seed)
    log_p = rng.normal(size=(1, S, T))
    path = monotonic_alignment_search(log_p, np.array([S]), np.array([T]))[0]
    assert path[0] == 0 and path[-1] == T - 1
    assert np.all(np.diff(path) >= 0) and np.all(np.diff(path) <= 1)
    assert abs(_path_score(log_p[0], path) - _brute_force_best(log_p[0])) < 1e-9


def test_mas_batched_with_padding_matches_single():
    rng = np.random.default_rng(0)
    log_p = rng.normal(size=(3, 9, 5))
    frame_lens, text_lens = np.array([9, 6, 7]), np.array([5, 3, 4])
    batched = monotonic_alignment_search(log_p, frame_lens, text_lens)
    for b in range(3):
        single = monotonic_alignment_search(log_p[b : b + 1, : frame_lens[b], : text_lens[b]], frame_lens[b : b + 1], text_lens[b : b + 1])[0]
        assert np.array_equal(batched[b, : frame_lens[b]], single)
        assert np.all(batched[b, frame_lens[b]:] == -1)


@settings(max_examples=40, deadline=None)
@given(word_sizes=st.lists(st.integers(1, 4), min_size=1, max_size=6), extra=st.integers(0, 20), seed=st.integers(0, 999))
def test_step_words_non_decreasing_and_cover_every_word(word_sizes, extra, seed):
    word_ids = torch.tensor([[i + 1 for i, n in enumerate(word_sizes) for _ in range(n)]])
    T = word_ids.shape[1]
    S = T + extra
    log_p = np.random.default_rng(seed).normal(size=(1, S, T))
    path = torch.from_numpy(monotonic_alignment_search(log_p, np.array([S]), np.array([T])))
    a = step_words_from_path(path, word_ids)[0]
    assert torch.all(a[1:] >= a[:-1])
    assert set(a.tolist()) == set(range(1, len(word_sizes) + 1))
    durations = torch.bincount(path[0], minlength=T)  # frames per token
    assert durations.sum() == S and torch.all(durations >= 1)


def test_too_few_frames_falls_back_to_even_split():
    path = monotonic_alignment_search(np.zeros((1, 3, 6)), np.array([3]), np.array([6]))[0]
    assert path.tolist() == [0, 2, 4]


def test_beta_binomial_prior_is_a_distribution_along_the_diagonal():
    prior = beta_binomial_log_prior(torch.tensor([40, 20]), torch.tensor([10, 5]), 40, 10)
    probs = prior.exp()
    assert torch.allclose(probs[0].sum(-1), torch.ones(40), atol=1e-4)
    assert torch.allclose(probs[1, :20, :5].sum(-1), torch.ones(20), atol=1e-4)
    peaks = probs[0].argmax(-1)
    assert peaks[0] == 0 and peaks[-1] == 9 and torch.all(peaks[1:] >= peaks[:-1])


def test_forward_sum_loss_prefers_monotonic_alignments():
    S, T = 12, 4
    diagonal = torch.full((1, S, T), -10.0)
    for s in range(S):
        diagonal[0, s, s * T // S] = 0.0
    reverse = diagonal.flip(-1)
    lens = (torch.tensor([T]), torch.tensor([S]))
    good, bad = forward_sum_loss(diagonal, *lens), forward_sum_loss(reverse, *lens)
    assert good < 0.5 and bad > 5 * good
    # padding cells past the lengths do not matter
    padded = torch.cat([diagonal, torch.randn(1, S, 3)], dim=2)
    assert torch.allclose(forward_sum_loss(padded, *lens), good)
