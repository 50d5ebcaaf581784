from pathlib import Path

import numpy as np

from tts.metrics import transcribe
from tts.voices import read_wav

FIXTURE = Path(__file__).parent.parent / "data" / "piper_fox.wav"


def test_transcripts_do_not_depend_on_what_was_transcribed_before():
    """Benchmarks compare transcripts of different audio made in one run; pocketsphinx keeps feature state from
    utterance to utterance, and without a reset 4 of these 20 noisy transcripts changed with the audio before."""
    audio, rate = read_wav(FIXTURE)
    rng = np.random.default_rng(0)
    noisy = [audio + rng.normal(0, scale, len(audio)).astype(np.float32) for scale in (0.02, 0.05, 0.1)]
    noisy += [audio * 0.01, np.convolve(audio, np.ones(16) / 16, "same").astype(np.float32)]
    before = [rng.normal(0, 0.3, len(audio)).astype(np.float32), audio * 3, audio[::-1].copy(),
              np.full(len(audio), 0.001, dtype=np.float32)]
    for clip in noisy:
        alone = transcribe(clip, rate)
        for other in before:
            transcribe(other, rate)
            assert transcribe(clip, rate) == alone
