"""`s5 eval` synthesises through the streaming engine that `s5 chat` runs."""
import asyncio

import numpy as np

from tts.eval.evaluate import synthesize_streaming
from tts.frontend.text import normalize_text
from tts.inference.streaming import join_chunks, synthesize_words
from tts.inference.synthesis import SynthesisConfig

TEXT = "Hello there, how are you today?"


def test_eval_audio_is_what_the_chat_engine_plays(tiny_bundle):
    for lookahead, mode in ((2, "s5"), (None, "t5")):
        bundle = tiny_bundle(lookahead)
        result = synthesize_streaming(bundle, TEXT, SynthesisConfig(seed=3))
        chunks, _ = asyncio.run(synthesize_words(bundle, normalize_text(TEXT), mode, config=SynthesisConfig(seed=3), max_stretch=1.0))
        assert result.chunks == len(chunks) > 0
        assert np.array_equal(result.audio, join_chunks(chunks))  # same engine, same seed: the very same samples
