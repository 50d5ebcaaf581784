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
    # a contraction is the words it stands for (Whisper writes either), not two errors
    assert error_rates(["When you are ready, here is mine."], ["When you're ready, here's mine."]) == (0.0, 0.0)
    assert words_for_scoring("I can't; they won't, we've") == "i can not they will not we have"
    assert error_rates(["You are right."], ["You were right."])[0] > 0  # a different word still counts


def test_distillmos_ranks_the_piper_voice_above_noise_and_a_damaged_copy():
    from tts.eval.metrics import distillmos

    audio, rate = read_wav(FIXTURE)
    clean = distillmos(audio, rate)
    noisy = distillmos(audio + np.random.default_rng(0).normal(0, 0.05, len(audio)).astype(np.float32), rate)
    crushed = distillmos(np.round(audio * 8) / 8, rate)  # 4-bit quantisation
    assert clean > 3.5 and noisy < clean - 1 and crushed < clean - 0.5
    assert distillmos(np.zeros(rate, np.float32), rate) == 1.0


def test_longest_silence_is_the_pause_inside_speech():
    from audio_io.levels import longest_silence_s

    rate = 16000
    tone = 0.3 * np.sin(np.arange(rate // 2) * 0.2).astype(np.float32)
    gap = np.zeros(int(0.8 * rate), np.float32)
    audio = np.concatenate([np.zeros(rate, np.float32), tone, gap, tone, np.zeros(2 * rate, np.float32)])
    assert abs(longest_silence_s(audio, rate) - 0.8) <= 0.02  # the leading and trailing silence do not count
    assert longest_silence_s(tone, rate) == 0.0
