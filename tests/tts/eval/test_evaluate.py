"""`s5 eval` synthesises through the pipeline that `s5 chat` runs."""
import asyncio

import numpy as np

from agent.orchestrator import Agent, AgentConfig
from audio_io.sinks import WavSink
from llm.replay import ReplayLLM, ReplayScript, ReplayTurn
from tts.eval.evaluate import synthesize_streaming
from tts.inference.synthesis import SynthesisConfig

TEXT = "Hello there, how are you today? It costs $45, 20% less."


def test_eval_audio_is_what_a_chat_turn_plays(tiny_bundle, tmp_path):
    for lookahead, mode in ((2, "s5"), (None, "t5")):
        bundle = tiny_bundle(lookahead)
        result = synthesize_streaming(bundle, TEXT, SynthesisConfig(seed=3))
        sink = WavSink(bundle.codec.sample_rate, tmp_path / "turn.wav", pace=False)
        agent = Agent(ReplayLLM(ReplayScript("eval", [ReplayTurn("hi", TEXT)], first_token_ms=0, tokens_per_second=500)),
                      {mode: bundle}, sink, AgentConfig(tts_mode=mode, synthesis=SynthesisConfig(seed=3), max_stretch=1.0))
        record = asyncio.run(agent.run_turn("hi"))
        assert record.error is None and record.synthesis.spoken_words > 0 and result.chunks > 0
        played = sink.audio()
        # same words, same seed, same engine: the same samples (the sink clips as a sound card would), up to float
        # rounding: alone, where chunks are cut follows the measured cost of each step, so the two runs may render
        # the same frames in pushes of other lengths (seen: 1e-7 at one sample in some runs, before and after 47.3)
        expected = np.clip(result.audio, -1, 1)
        assert expected.shape == played.shape
        np.testing.assert_allclose(played, expected, rtol=0, atol=1e-6)
