"""A long reply through the shipped voice keeps its pace: the engine's synthesis units keep every unit inside what
the model was trained on (one decoder context over 170 words derailed into babble after about 15 s)."""
import asyncio

import pytest

from audio_io.levels import longest_silence_s
from tts.cli import read_sentences
from tts.data.voices import VOICES
from tts.frontend.text import normalize_text
from tts.inference.pipeline import speak
from tts.inference.synthesis import SynthesisConfig
from tts.paths import CONFIGS


@pytest.mark.slow
def test_a_300_word_reply_lasts_as_long_as_the_teacher_says_it_and_never_stalls():
    from tts.inference.streaming import load_bundle

    replies = read_sentences(CONFIGS / "long_replies.txt")
    text = f"{replies[0]} {replies[2]}"  # an explanation and a plan: 368 words
    words = normalize_text(text)
    assert len(words) >= 300
    bundle = load_bundle("s5")
    speech = asyncio.run(speak(bundle, words, "s5", config=SynthesisConfig(seed=0), max_stretch=1.0))
    rate = bundle.codec.sample_rate
    audio = speech.audio
    reference = VOICES["piper_joe"].synthesize(text).audio
    assert 0.8 <= len(audio) / len(reference) <= 1.25  # derailed, it lasted 3.5 x the teacher (1 s a word)
    assert longest_silence_s(audio, rate) <= 1.0
    assert speech.times.capped_words <= 3  # words that ran into the frame cap: a dwelling decoder
    assert [w for c in speech.chunks for w in c.words] == [w for w in words if any(ch.isalnum() for ch in w)]
