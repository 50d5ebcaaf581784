from pathlib import Path

import numpy as np

from audio_io.wav import read_wav
from tts.eval.metrics import error_rates, transcribe, words_for_scoring

FIXTURE = Path(__file__).parents[2] / "data" / "piper_fox.wav"
FOX = "The quick brown fox jumps over the lazy dog."


def test_whisper_hears_the_piper_voice_and_not_noise():
    audio, rate = read_wav(FIXTURE)
    wer, _ = error_rates([FOX], [transcribe(audio, rate)])
    assert wer <= 20
    noise = np.random.default_rng(0).normal(0, 0.05, len(audio)).astype(np.float32)
    assert error_rates([FOX], [transcribe(noise, rate)])[0] >= 80
    assert transcribe(audio[:100], rate) == ""  # too short to hold a word


def test_transcripts_do_not_depend_on_what_was_transcribed_before():
    """Benchmarks compare transcripts of different audio made in one run: no state may carry over."""
    audio, rate = read_wav(FIXTURE)
    rng = np.random.default_rng(0)
    clip = audio + rng.normal(0, 0.05, len(audio)).astype(np.float32)
    alone = transcribe(clip, rate)
    for other in (rng.normal(0, 0.3, len(audio)).astype(np.float32), audio[::-1].copy()):
        transcribe(other, rate)
        assert transcribe(clip, rate) == alone


def test_scoring_normalises_both_sides_alike():
    assert words_for_scoring("It costs $45, Mr. Smith!") == words_for_scoring("it costs forty-five dollars mister smith")
    assert error_rates(["Twenty two cats."], ["22 cats"]) == (0.0, 0.0)
