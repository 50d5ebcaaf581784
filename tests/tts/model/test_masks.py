"""The lookahead-causal masks, and property tests proving the whole model leaks nothing past the lookahead."""
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.conftest import flatten_words, tiny_config
from tts.model.masks import (
    active_version,
    causal_mask,
    cross_slot_mask,
    decoder_mask,
    encoder_mask,
)
from tts.model.s5tts import S5TTS, teacher_forcing

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
words_strategy = st.lists(st.lists(st.integers(3, 63), min_size=1, max_size=4), min_size=4, max_size=10)


def test_encoder_mask_definition():
    w = torch.tensor([1, 1, 2, 3, 3, 4, 0])
    m = encoder_mask(w, 1)
    for t in range(7):
        for u in range(7):
            assert bool(m[t, u]) == (w[u] > 0 and w[u] <= w[t] + 1)
    assert encoder_mask(w, None)[:, -1].sum() == 0 and encoder_mask(w, None)[:, :-1].all()


def test_decoder_mask_definition():
    w = torch.tensor([1, 2, 2, 3, 4, 5])
    a = torch.tensor([1, 1, 2, 4])
    m = decoder_mask(w, a, 2)
    expected = (w[None, :] <= a[:, None] + 2)
    assert torch.equal(m, expected)
    assert decoder_mask(w, a, None).all()
    assert torch.equal(causal_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool))


def test_cross_slot_mask_picks_one_version_per_visible_token():
    w = torch.tensor([1, 2, 3, 4, 5, 6])
    k = 2
    slot_words = w.repeat_interleave(k + 1)
    slot_versions = torch.arange(k + 1).repeat(len(w))
    a = torch.tensor([1, 2, 3, 4])
    m = cross_slot_mask(slot_words, slot_versions, a, k).view(len(a), len(w), k + 1)
    visible = decoder_mask(w, a, k)
    assert torch.equal(m.any(-1), visible)
    assert (m.sum(-1) <= 1).all()
    # the final version (k) for words <= A(s), version A(s)+k-w for lookahead words
    assert torch.equal(active_version(w, a, k)[0, :3], torch.tensor([2, 1, 0]))


def _final_encoder_outputs(model, words):
    tokens, word_ids = flatten_words(words)
    with torch.no_grad():
        encoded = model.encode(tokens, word_ids)  # (1, T, J, C)
    return encoded[0, :, -1], word_ids[0]


def _modify_after(words, cut, data, remove):
    if remove:
        return words[:cut]
    changed = [list(w) for w in words]
    for i in range(cut, len(words)):
        changed[i] = [3 + (t + data.draw(st.integers(1, 59))) % 61 for t in words[i]] + [data.draw(st.integers(3, 63))]
    return changed


@SETTINGS
@given(words=words_strategy, data=st.data(), remove=st.booleans())
def test_encoder_word_n_ignores_words_after_n_plus_k(words, data, remove):
    k = 2
    n = data.draw(st.integers(1, len(words)))
    cut = n + k  # words with index > n + k (1-based) start at list position n + k
    assume(cut < len(words))
    changed = _modify_after(words, cut, data, remove)
    for lookahead, must_match in ((k, True), (None, False)):
        torch.manual_seed(0)
        model = S5TTS(tiny_config(lookahead)).eval()
        out_a, ids_a = _final_encoder_outputs(model, words)
        out_b, ids_b = _final_encoder_outputs(model, changed)
        # word n's tokens, except EOS which sits on the last word and is not part of word n when n < N
        sel_a, sel_b = ids_a == n, ids_b == n
        diff = (out_a[sel_a][: sel_b.sum()] - out_b[sel_b][: sel_a.sum()]).abs().max().item()
        if must_match:
            assert diff <= 1e-5, f"word {n} changed by {diff} when words after {n + k} changed"
        else:
            assert diff > 1e-4, "full-context encoder did not react to the change: the test is blind"


@SETTINGS
@given(words=words_strategy, data=st.data(), remove=st.booleans())
def test_decoder_step_s_ignores_words_after_A_s_plus_k(words, data, remove):
    k = 2
    N = len(words)
    S = data.draw(st.integers(5, 30))
    step_words = torch.tensor(sorted(data.draw(st.lists(st.integers(1, N), min_size=S + 1, max_size=S + 1))))
    s = data.draw(st.integers(0, S))
    cut = int(step_words[s]) + k
    assume(cut < N)
    changed = _modify_after(words, cut, data, remove)
    codes = torch.randint(0, 20, (1, 3, S))
    for lookahead, must_match in ((k, True), (None, False)):
        torch.manual_seed(0)
        model = S5TTS(tiny_config(lookahead)).eval()
        logits = []
        for variant in (words, changed):
            tokens, word_ids = flatten_words(variant)
            inputs, _, _ = teacher_forcing(codes, torch.tensor([S]), model.config.bos_id, model.config.eos_id)
            a = step_words.clamp(max=len(variant))[None]
            with torch.no_grad():
                memory = model.memory_slots(model.encode(tokens, word_ids), word_ids)
                logits.append(model.decode(inputs, memory, a).logits[0, : s + 1])
        diff = (logits[0] - logits[1]).abs().max().item()
        if must_match:
            assert diff <= 1e-5, f"logits up to step {s} changed by {diff} (A(s)={int(step_words[s])})"
        else:
            assert diff > 1e-4, "full-context decoder did not react to the change: the test is blind"
