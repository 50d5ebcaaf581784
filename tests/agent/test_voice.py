"""Spoken turns end to end: a question spoken by another voice, heard through the listener (VAD + Whisper), answered
in every mode by the (tiny random) TTS; the voice-to-voice figures that `s5 bench voice` reports."""
import asyncio

from agent.bench.voice import bench_voice
from llm.replay import ReplayScript


def test_bench_voice_hears_the_question_and_times_every_mode(tiny_bundle):
    t5 = tiny_bundle(None)
    bundles = {"s5": tiny_bundle(2), "t5": t5, "sentence": t5}
    script = ReplayScript.from_dict({"name": "voice", "llm": {"first_token_ms": 50, "tokens_per_second": 100},
                                     "turns": [{"user": "What is the weather like tomorrow?", "assistant": "Sunny and warm."}]})
    result = asyncio.run(bench_voice(script, bundles))
    assert result["questions"] == 1 and result["asr_wer"] <= 20  # flite's voice, transcribed by Whisper
    for mode in ("s5", "t5", "sentence"):
        figures = result[mode]
        assert figures["errors"] == 0 and figures["turns"] == 1
        # the answer waits at least for the VAD's end-of-speech pause (a turn started on the guess is held till then)
        assert figures["v2v_ms_p50"] > 600 and figures["v2v_ms_p50"] > figures["transcript_after_speech_ms_p50"]
        # the reply comes back into the microphone at full level: it must neither interrupt nor become a line
        assert figures["false_barge_ins"] == 0 and figures["echo_lines"] == 0 and figures["retracted"] == 0
    assert result["ratio_v2v_s5_over_t5"] > 0
