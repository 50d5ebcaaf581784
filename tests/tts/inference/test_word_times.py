"""Word times from the engine's own alignment: every spoken word placed in the audio, in order, back to back; a
chunk announces each word no later than it carries the word's start; captions render them."""
from __future__ import annotations

import asyncio

import pytest

from agent.captions import captions
from tts.inference.pipeline import speak
from tts.inference.stream_parts import WordTime, WordTimeline
from tts.inference.synthesis import SynthesisConfig

WORDS = "Hello there, my friend. The train leaves at six, twenty minutes late.".split()


def test_a_timeline_follows_stretched_renders_and_the_dropped_silence():
    timeline = WordTimeline(1000)
    assert timeline.word_done("a", 2) == (0, 2) and timeline.word_done("b", 3) == (2, 5)
    timeline.rendered(2, 200)  # 2 frames at 100 samples a frame
    assert timeline.time("b", (2, 5)) is None  # not rendered yet
    timeline.rendered(3, 450)  # paced: 1.5 x slower
    timeline.dropped = 50  # leading silence not sent
    assert timeline.time("a", (0, 2)) == WordTime("a", 0.0, 0.15)
    assert timeline.time("b", (2, 5)) == WordTime("b", 0.15, 0.6)
    assert timeline.seconds(3) == pytest.approx(0.3)  # a third of the way through the stretched render


@pytest.mark.parametrize("mode, k", [("s5", 2), ("t5", None), ("sentence", None)])
def test_every_word_is_placed_back_to_back_and_announced_before_its_sound(tiny_bundle, mode, k):
    bundle = tiny_bundle(k)
    result = asyncio.run(speak(bundle, WORDS, mode, words_per_second=30.0,
                               config=SynthesisConfig(seed=3, max_frames_per_word=4), max_stretch=1.0))
    times, rate = result.times.word_times, bundle.codec.sample_rate
    audio_s = sum(len(c.samples) for c in result.chunks) / rate
    assert [t.word for t in times] == WORDS
    assert times[0].start_s == 0.0 and all(t.end_s >= t.start_s for t in times)
    assert all(a.end_s == pytest.approx(b.start_s) for a, b in zip(times, times[1:]))  # every frame is one word's
    assert times[-1].end_s == pytest.approx(audio_s, abs=1.0 / bundle.codec.frame_rate)
    received_s, announced = 0.0, []
    for chunk in result.chunks:  # as a client receives them: a chunk's word events, then its audio
        for word in chunk.word_times:
            assert word.start_s >= received_s - 1e-6  # its start is in this chunk or later, not in audio already sent
            announced.append(word.word)
        received_s += len(chunk.samples) / rate
    assert announced == WORDS  # each once, in order


def test_captions_in_srt_and_vtt():
    words = [WordTime("Hello", 0.0, 0.29), WordTime("there,", 0.29, 3661.5)]
    assert captions(words, "srt") == ("1\n00:00:00,000 --> 00:00:00,290\nHello\n\n"
                                      "2\n00:00:00,290 --> 01:01:01,500\nthere,\n")
    assert captions(words, "vtt").startswith("WEBVTT\n\n00:00:00.000 --> 00:00:00.290\nHello\n")
