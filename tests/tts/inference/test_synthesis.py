"""The word-by-word synthesis state machine, on a tiny random model (the control flow, not the voice)."""
import numpy as np
import pytest
import torch

from tts.inference.synthesis import (
    SynthesisConfig,
    UtteranceSynthesizer,
    synthesize_text,
)


@pytest.fixture(scope="module")
def bundle_factory(tiny_bundle):
    return tiny_bundle


def test_generation_waits_for_lookahead_words(bundle_factory):
    synth = UtteranceSynthesizer(bundle_factory(2), SynthesisConfig(seed=0, max_frames_per_word=6))
    for word in ["hello", "there"]:
        synth.push_word(word)
        assert synth.step() == []  # word 1 needs word 3 (k = 2)
    synth.push_word("friend.")
    chunks = synth.step()
    assert [c.word_index for c in chunks] == [1]  # only word 1 may be generated now
    synth.end()
    chunks += synth.step()
    assert [c.word_index for c in chunks] == [1, 2, 3] and synth.finished
    assert all(1 <= c.codes.shape[1] <= 6 for c in chunks)
    assert all(int(c.codes.max()) < 1000 for c in chunks)


def test_t5_mode_waits_for_the_end(bundle_factory):
    synth = UtteranceSynthesizer(bundle_factory(None), SynthesisConfig(seed=0, max_frames_per_word=4))
    for word in ["one", "two", "three", "four"]:
        synth.push_word(word)
        assert synth.step() == []
    synth.end()
    assert [c.word_index for c in synth.step()] == [1, 2, 3, 4]


def test_words_without_phonemes_are_skipped_and_empty_text_finishes(bundle_factory):
    synth = UtteranceSynthesizer(bundle_factory(2), SynthesisConfig(seed=0, max_frames_per_word=3))
    assert synth.push_word("") is False
    synth.end()
    assert synth.step() == [] and synth.finished
    codes, chunks = synthesize_text(bundle_factory(2), "", SynthesisConfig(seed=0))
    assert codes.shape[1] == 0 and chunks == []


def test_frame_cap_bounds_every_word(bundle_factory):
    codes, chunks = synthesize_text(bundle_factory(2), "A fairly long sentence, with several words in it!", SynthesisConfig(seed=1, max_frames_per_word=5))
    assert len(chunks) == 9 and codes.shape[1] == sum(c.codes.shape[1] for c in chunks) <= 45
    audio = bundle_factory(2).codec.decode(codes)
    assert len(audio) == codes.shape[1] * bundle_factory(2).codec.samples_per_frame and np.isfinite(audio).all()


def test_same_seed_same_codes_and_no_state_between_utterances(bundle_factory):
    bundle = bundle_factory(2)
    runs = [synthesize_text(bundle, "Back to back requests.", SynthesisConfig(seed=3, max_frames_per_word=5))[0] for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
