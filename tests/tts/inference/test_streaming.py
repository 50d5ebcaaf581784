"""The streaming engine on a tiny random model: when audio may leave, what it carries, stress and cancellation."""
import asyncio
import time

import numpy as np
import pytest
import torch

from audio_io.levels import audible_onset, first_audible_sample
from tts.codec.base import held_back_frames
from tts.inference.pipeline import join_chunks, speak
from tts.inference.stream_parts import split_units
from tts.inference.streaming import LeadingSilence, Pacer, StreamingSynthesizer
from tts.inference.tuning import TUNING

MAX_OPENING_HOLD_S, OPENING_FRAMES_PAST_HOLDBACK = TUNING.max_opening_hold_s, TUNING.opening_frames_past_holdback
from tts.inference.synthesis import SynthesisConfig

WORDS = "Hello there, my friend. How are you doing today?".split()


def run(coro):
    return asyncio.run(coro)


async def synthesize_words(bundle, words, mode="s5", words_per_second=0.0, config=None, emit_every=None, prompt=None,
                           **options):
    """The pipeline driver with an unpaced clock sink: every chunk and the synthesizer's stamps."""
    speech = await speak(bundle, words, mode, words_per_second, config, emit_every=emit_every, prompt=prompt, **options)
    return speech.chunks, speech.times


def join_codes(chunks) -> torch.Tensor:
    return torch.cat([c.codes for c in chunks if c.codes is not None], dim=1)


def synth_config(**overrides) -> SynthesisConfig:
    return SynthesisConfig(**{"seed": 3, "max_frames_per_word": 5, **overrides})


def test_s5_speaks_only_after_the_lookahead_words(tiny_bundle):
    chunks, times = run(synthesize_words(tiny_bundle(2), WORDS, "s5", words_per_second=40, config=synth_config()))
    assert times.start_allowed_ns == times.word_arrivals_ns[2]  # word k+1 = 3
    audible = [c for c in chunks if len(c.samples)]
    assert audible[0].created_ns >= times.word_arrivals_ns[2]
    assert times.words == len(WORDS) and times.frames == sum(c.frames for c in chunks)



def test_the_first_sounds_parts_follow_one_another_and_add_up_to_its_first_chunk(tiny_bundle):
    """`SpeechResult.opening_ms`: the first word's arrival, the first decoded frame, its render asked and back, the
    first chunk: each part starts where the last ended, so they add up to the first chunk's time."""
    speech = run(speak(tiny_bundle(2), WORDS, "s5", words_per_second=40, config=synth_config()))
    parts, t = speech.opening_ms, speech.times
    assert list(parts) == ["to_first_frame", "decoding", "rendering", "to_chunk"]
    assert all(ms >= 0 for ms in parts.values())
    assert parts["to_first_frame"] >= (t.word_arrivals_ns[2] - t.word_arrivals_ns[0]) / 1e6  # s5 waits for word 3
    assert sum(parts.values()) == pytest.approx((t.first_chunk_ns - t.first_word_ns) / 1e6)
    assert t.first_codec_frame_ns <= t.first_render_asked_ns <= t.first_render_done_ns <= t.first_chunk_ns

def test_t5_waits_for_the_end_and_emits_every_n_steps(tiny_bundle):
    chunks, times = run(synthesize_words(tiny_bundle(None), WORDS, "t5", words_per_second=40, config=synth_config(), emit_every=7))
    assert all(c.created_ns >= times.end_ns for c in chunks)
    frames = [c.frames for c in chunks if c.frames]
    assert all(1 <= f <= 7 for f in frames) and frames[-1] <= 7
    assert sum(f < 7 for f in frames) <= len(split_units(WORDS))  # a shorter chunk only where a unit ends


def test_sentence_mode_starts_at_the_first_sentence_end(tiny_bundle):
    chunks, times = run(synthesize_words(tiny_bundle(None), WORDS, "sentence", words_per_second=40, config=synth_config()))
    assert times.start_allowed_ns == times.word_arrivals_ns[3]  # "friend."
    assert chunks[0].created_ns >= times.word_arrivals_ns[3]
    assert times.words == len(WORDS)


@pytest.mark.parametrize("words_per_second", [0.0, 200.0, 15.0])
def test_word_rate_changes_timing_not_output(tiny_bundle, words_per_second):
    """Words faster or slower than synthesis: the same codes come out, in the same total length, as offline."""
    bundle = tiny_bundle(2)
    offline, _ = run(synthesize_words(bundle, WORDS, "t5", config=synth_config()))  # S5 weights, all words known
    streamed, times = run(synthesize_words(bundle, WORDS, "s5", words_per_second, config=synth_config()))
    assert torch.equal(join_codes(offline), join_codes(streamed))
    assert len(join_chunks(streamed)) == len(join_chunks(offline)) == times.frames * bundle.codec.samples_per_frame
    assert times.paced_s == 0 and all(c.play_after_ns is None for c in streamed)  # 5+ words/s: never paced


def test_pacing_holds_and_slows_down_only_for_slow_text(tiny_bundle):
    """Text at 2 words/s (slower than 5/s): the first chunk carries a prebuffer (three words' text time, at most
    1 s) and words are stretched while the engine waits; all words at once: neither."""
    bundle = tiny_bundle(2)
    offline, _ = run(synthesize_words(bundle, WORDS, "t5", config=synth_config()))
    slow, slow_times = run(synthesize_words(bundle, WORDS, "s5", 2.0, synth_config()))
    assert torch.equal(join_codes(offline), join_codes(slow))  # pacing changes the rendering, never the speech
    stretched = len(join_chunks(offline)) + slow_times.paced_s * bundle.codec.sample_rate
    assert len(join_chunks(slow)) == pytest.approx(stretched, abs=len(slow) * 256)  # stretched frames round per chunk
    audible = [c for c in slow if len(c.samples)]
    assert audible[0].play_after_ns is not None and all(c.play_after_ns is None for c in audible[1:])
    assert audible[0].play_after_ns - audible[0].created_ns <= 1e9  # held at most the prebuffer past its rendering
    assert slow_times.prebuffer_ms == 1000 and slow_times.paced_s > 0
    fast, fast_times = run(synthesize_words(bundle, WORDS, "s5", 0.0, synth_config()))
    assert all(c.play_after_ns is None for c in fast) and fast_times.paced_s == 0 and fast_times.prebuffer_ms == 0
    off, off_times = run(synthesize_words(bundle, WORDS, "s5", 2.0, synth_config(), max_stretch=1.0))
    assert all(c.play_after_ns is None for c in off) and off_times.paced_s == 0


def test_pacer_stretches_just_enough_and_never_beyond_its_limit():
    pacer = Pacer(max_stretch=1.5, margin_s=0.0)
    assert pacer.stretch(0, 0.2, None) == 1.0  # nothing to wait for: as is (the player now holds 0.2 s)
    assert pacer.stretch(int(0.1e9), 0.2, int(0.4e9)) == pytest.approx(1.5)  # 0.1 s buffered + 0.2 * s must cover 0.4 s
    assert pacer.play_end_ns == int(0.2e9) + int(0.3e9)
    assert pacer.stretch(int(0.2e9), 0.3, int(0.2e9)) == 1.0  # 0.3 s still buffered: enough
    assert Pacer.prebuffer_ns(None) == Pacer.prebuffer_ns(int(0.1e9)) == 0  # an LLM stream: no hold
    assert Pacer.prebuffer_ns(int(0.25e9)) == int(0.75e9) and Pacer.prebuffer_ns(int(2e9)) == int(1e9)
    # a slow LLM: words at 10/s look fast, but at 10 tokens/s one word of many tokens takes most of a second
    assert Pacer.pace_interval_ns(int(0.1e9), int(0.04e9)) == int(0.18e9)  # 25 tokens/s: not paced
    assert Pacer.prebuffer_ns(int(0.1e9), int(0.04e9)) == 0
    assert Pacer.prebuffer_ns(int(0.1e9), int(0.1e9)) == int(0.8e9)  # 10 tokens/s: eight tokens' time
    assert Pacer.prebuffer_ns(int(0.1e9), int(0.05e9)) == int(0.4e9)  # 20 tokens/s


@pytest.mark.parametrize("token_s, held", [(0.1, True), (0.03, False)])
def test_a_slow_llms_token_rate_paces_the_speech(tiny_bundle, token_s, held):
    """Tokens noted by the caller (`note_token`): one word per token at 10 tokens/s is paced (the first chunk
    held eight tokens' time), at 33 tokens/s it is not; the speech is the same."""
    from audio_io.sinks import ClockSink
    from tts.inference.pipeline import Speech

    bundle = tiny_bundle(2)
    synth = StreamingSynthesizer(bundle, "s5", synth_config())

    async def one_token_words():
        for word in WORDS:
            synth.note_token(time.perf_counter_ns())
            yield word
            await asyncio.sleep(token_s)

    result = run(Speech(synth, ClockSink(bundle.codec.sample_rate, pace=False), keep_chunks=True).run(one_token_words()))
    first = next(c for c in result.chunks if len(c.samples))
    assert (first.play_after_ns is not None) is held
    assert 700 < result.times.prebuffer_ms <= 1000 if held else result.times.prebuffer_ms == 0
    offline, _ = run(synthesize_words(bundle, WORDS, "t5", config=synth_config()))
    assert torch.equal(join_codes(offline), join_codes(result.chunks))


def test_one_word_and_two_hundred_words(tiny_bundle):
    bundle = tiny_bundle(2)
    chunks, times = run(synthesize_words(bundle, ["Yes."], "s5", config=synth_config()))
    assert times.words == 1 and len(join_chunks(chunks)) == times.frames * bundle.codec.samples_per_frame > 0
    many = [f"word{i % 7}" if i % 3 else "and" for i in range(200)]
    chunks, times = run(synthesize_words(bundle, many, "s5", config=synth_config(max_frames_per_word=2)))
    assert times.words == 200 and 200 <= times.frames <= 400
    assert np.isfinite(join_chunks(chunks)).all()


def test_punctuation_only_and_very_long_words(tiny_bundle):
    bundle = tiny_bundle(2)
    chunks, times = run(synthesize_words(bundle, ["...", "!!!", "?"], "s5", config=synth_config()))
    assert times.frames == 0 and chunks == []
    long_word = "pneumonoultramicroscopicsilicovolcanoconiosis" * 4
    chunks, times = run(synthesize_words(bundle, ["a", long_word, "b"], "s5", config=synth_config(max_frames_per_word=9)))
    assert times.words == 3 and times.frames <= 27


def test_cancellation_mid_utterance_releases_everything(tiny_bundle):
    async def scenario():
        synth = StreamingSynthesizer(tiny_bundle(2), "s5", synth_config(max_frames_per_word=50))
        for word in WORDS:
            synth.push_word(word)  # never ended: a reply still streaming in
        received = []
        async for chunk in synth.chunks():
            received.append(chunk)
            await synth.aclose()
        return synth, received

    synth, received = run(scenario())
    assert len(received) == 1 and synth.released
    assert synth.times.words < len(WORDS)


def test_cancelling_the_consumer_task_releases_too(tiny_bundle):
    async def scenario():
        synth = StreamingSynthesizer(tiny_bundle(2), "s5", synth_config())
        synth.push_word("hello")  # waits forever for more words
        task = asyncio.create_task(anext(synth.chunks()))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await synth.aclose()
        return synth

    assert run(scenario()).released


def test_two_utterances_back_to_back_behave_alike(tiny_bundle):
    """No state survives a request: the same text twice gives the same codes and as much sound. (Where the chunks
    are cut follows the measured cost of each step and render, a wall-clock matter, so it is not compared.)"""
    bundle = tiny_bundle(2)

    async def twice():
        return [await synthesize_words(bundle, WORDS, "s5", 100.0, synth_config()) for _ in range(2)]

    (first, t1), (second, t2) = run(twice())
    assert sum(len(c.samples) for c in first) == sum(len(c.samples) for c in second) > 0
    assert torch.equal(join_codes(first), join_codes(second))
    assert t1.words == t2.words and t1.frames == t2.frames


def test_unknown_mode_and_s5_mode_on_a_full_context_model_are_refused(tiny_bundle):
    with pytest.raises(ValueError, match="unknown mode"):
        StreamingSynthesizer(tiny_bundle(2), "fast")
    with pytest.raises(ValueError, match="S5 checkpoint"):
        StreamingSynthesizer(tiny_bundle(None), "s5")


def test_first_audible_window():
    assert first_audible_sample(np.r_[np.zeros(25), np.full(10, 0.02)], 1000) == 20  # -34 dBFS window 20..29
    assert first_audible_sample(np.full(50, 0.005), 1000) is None  # -46 dBFS


def test_audible_onset_slides_by_one_sample():
    quiet_then_loud = np.r_[np.zeros(25), np.full(10, 0.02)]
    assert audible_onset(quiet_then_loud, 1000) == 18  # window 18..27 holds three loud samples: -39.2 dBFS
    assert first_audible_sample(quiet_then_loud, 1000) == 20 and first_audible_sample(quiet_then_loud[18:], 1000) == 0
    assert audible_onset(np.full(50, 0.005), 1000) is None and audible_onset(np.full(5, 0.5), 1000) is None


def test_leading_silence_is_dropped_and_nothing_after_it():
    """The sound starts at its first audible window however the audio is cut into pushes; later pushes pass as they are."""
    audio = np.r_[np.zeros(37), np.full(30, 0.05), np.zeros(20), np.full(13, 0.05)].astype(np.float32)
    for cuts in ([100], [10, 20, 50, 100], [40, 41, 100]):
        trim, parts, start = LeadingSilence(1000), [], 0
        for end in cuts:
            parts.append(trim(audio[start:end]))
            start = end
        out = np.concatenate(parts)
        # the window 28..37 holds one loud sample: already audible (-36 dBFS); the fade (one sample) is on a zero
        assert len(out) == len(audio) - 28 and np.array_equal(out, audio[28:]) and first_audible_sample(out, 1000) == 0
    assert len(LeadingSilence(1000)(np.zeros(500, np.float32))) == 0  # silence alone never plays


def test_the_opening_words_sound_leaves_before_the_word_is_complete(tiny_bundle):
    """LLM-speed text whose lookahead is in: the first word's frames leave from OPENING_FRAMES_PAST_HOLDBACK steps past
    what the codec holds back (a causal codec decoder: one less), not when the word is complete; the codes are those
    of offline synthesis."""
    from dataclasses import replace

    from tts.codec.mel_codec import MelCodec, MelCodecModel

    bundle, config = tiny_bundle(2), synth_config(min_frames_per_word=12, max_frames_per_word=12)
    offline, _ = run(synthesize_words(bundle, WORDS, "t5", config=config))
    chunks, _ = run(synthesize_words(bundle, WORDS, "s5", 200.0, config=config))
    first = next(c for c in chunks if len(c.samples))
    first_render = held_back_frames(bundle.codec) + OPENING_FRAMES_PAST_HOLDBACK
    assert held_back_frames(bundle.codec) == 3  # one codec frame of lookahead, the vocoder's four mel frames
    causal = MelCodec(MelCodecModel(replace(bundle.codec.config, decoder_lookahead=0)), bundle.codec.vocoder)
    assert held_back_frames(causal) == 2
    assert first_render <= first.frames < 12 and first.words == ()
    assert torch.equal(join_codes(offline), join_codes(chunks))


def test_a_ready_opening_leaves_when_its_text_arrives_before_that_text_is_encoded(tiny_bundle):
    """The opening's sound is rendered and waits for the second word's lookahead text (word 4): the work after that
    word arrives sends what was rendered at once, and encodes word 4 only after (the encoder pass is not in the
    floor). The schedule is driven call by call, without the driver's thread, on a clock where model work takes
    no time (on a loaded machine a slow render makes the opening word long, and a long one leaves at once)."""
    from tts.inference.schedule import StreamSchedule
    from tts.inference.stream_parts import Inbox, UtteranceTimes

    bundle, config = tiny_bundle(2), synth_config(min_frames_per_word=12, max_frames_per_word=12)
    ticks = iter(range(10**9))
    inbox = Inbox(UtteranceTimes(), clock=lambda: next(ticks))
    schedule = StreamSchedule(bundle, "s5", config, 8, inbox)
    for word in WORDS[:3]:
        inbox.put_word(word)
    for _ in range(schedule.opening_first_render):
        chunk, _ = schedule.work()
        assert chunk is None
        if schedule.opening_ready:
            break
    assert schedule.opening_ready, "the opening word's first frames should be rendered and ready"
    rendered = schedule._unsent_frames
    inbox.put_word(WORDS[3])
    chunk, state = schedule.work()
    assert state == "progress" and chunk is not None and chunk.frames == rendered and len(chunk.samples)
    assert len(schedule.units[0].words) == 3  # word 4 waits for the next call


def test_a_voice_prompt_prefixes_the_decoder_and_only_our_words_are_spoken(tiny_bundle):
    from tts.inference.synthesis import UtteranceSynthesizer, VoicePrompt

    bundle = tiny_bundle(2)
    prompt_codes = torch.randint(0, 1000, (8, 17))
    prompt = VoicePrompt.from_codes(bundle, "This is my voice.", prompt_codes)
    assert len(prompt.words) == 4 and prompt.frame_words.shape == (17,)
    assert int(prompt.frame_words[0]) == 1 and int(prompt.frame_words[-1]) <= 4
    assert bool((prompt.frame_words.diff() >= 0).all())
    synth = UtteranceSynthesizer(bundle, synth_config(), prompt)
    for word in ["Hello", "there", "friend."]:
        synth.push_word(word)
    synth.end()
    chunks = synth.step()
    assert [c.word_index for c in chunks] == [1, 2, 3]
    # prefill: BOS + 16 prompt frames; then one step per frame of ours (and one more if EOS ended it)
    assert 17 + len(synth.frames) <= synth.decoder.position <= 18 + len(synth.frames)
    # streaming with the prompt equals offline with the prompt
    offline, _ = run(synthesize_words(bundle, WORDS, "t5", config=synth_config(), prompt=prompt))
    streamed, _ = run(synthesize_words(bundle, WORDS, "s5", 50.0, config=synth_config(), prompt=prompt))
    assert torch.equal(join_codes(offline), join_codes(streamed))
    plain, _ = run(synthesize_words(bundle, WORDS, "s5", config=synth_config()))
    assert join_codes(plain).shape != join_codes(streamed).shape or not torch.equal(join_codes(plain), join_codes(streamed))


def test_each_chunk_names_its_words_so_a_gap_can_be_traced(tiny_bundle):
    from audio_io.sinks import PlaybackStats
    from tts.inference.pipeline import gap_report

    speech = run(speak(tiny_bundle(2), WORDS, "s5", config=synth_config()))
    assert [w for c in speech.chunks for w in c.words] == WORDS  # s5: every word once, in order
    starts = [start for start, _ in speech.times.chunk_words]
    assert starts == sorted(starts) and starts[0] == 0.0
    second_start = speech.times.chunk_words[1][0]
    next_word = next(words for start, words in speech.times.chunk_words[1:] if words)  # a mid-word chunk names none
    gaps = gap_report(PlaybackStats(gaps=[[second_start, 42.0]]), speech.times)
    assert gaps == [{"at_s": round(second_start, 2), "ms": 42.0, "before": " ".join(speech.times.chunk_words[0][1]),
                     "after": " ".join(next_word)}]


async def _words_with_a_pause(words, pause_after: int, pause_s: float, arrivals: list):
    """All words at once, except a pause before word pause_after + 1 (a number's many tokens still arriving)."""
    for i, word in enumerate(words):
        if i == pause_after:
            await asyncio.sleep(pause_s)
        arrivals.append(time.perf_counter_ns())
        yield word


@pytest.mark.parametrize("pause_s, held", [(0.25, True), (1.0, False)])
def test_a_short_opening_word_waits_for_the_next_words_text(tiny_bundle, pause_s, held):
    """"Your | balance is $738.67": word 2 needs word 4, whose text comes late. The short first word waits for it
    (so the player does not run dry after it), but never longer than MAX_OPENING_HOLD_S; the speech is the same."""
    from audio_io.sinks import ClockSink
    from tts.inference.pipeline import Speech

    bundle, config = tiny_bundle(2), synth_config(min_frames_per_word=4, max_frames_per_word=4)  # 0.19 s words
    offline, _ = run(synthesize_words(bundle, WORDS, "t5", config=config))
    arrivals: list[int] = []
    synth = StreamingSynthesizer(bundle, "s5", config)
    speech = Speech(synth, ClockSink(bundle.codec.sample_rate, pace=False), keep_chunks=True)
    result = run(speech.run(_words_with_a_pause(WORDS, 3, pause_s, arrivals)))
    first = next(c for c in result.chunks if len(c.samples))
    assert (first.created_ns > arrivals[3]) is held  # word 4 ("friend.") lets word 2 start
    assert result.times.opening_hold_ms > 0 and (pause_s > MAX_OPENING_HOLD_S) is not held
    assert torch.equal(join_codes(offline), join_codes(result.chunks))  # timing changes, never the speech


def test_a_break_ends_the_words_before_it_and_the_rest_start_afresh(tiny_bundle):
    """A code block the voice skips: the words before it are spoken as a whole text (no waiting for lookahead words
    after the block), the words after it as another; the same codes as synthesising the two texts one by one."""
    from tts.inference.streaming import SEGMENT_BREAK

    bundle, config = tiny_bundle(2), synth_config()
    before, after = WORDS[:4], WORDS[4:]
    first, _ = run(synthesize_words(bundle, before, "s5", config=config))
    chunks, times = run(synthesize_words(bundle, [*before, SEGMENT_BREAK, *after], "s5", 200.0, config=config))
    codes = join_codes(chunks)
    assert torch.equal(codes[:, : join_codes(first).shape[1]], join_codes(first))
    assert times.words == len(WORDS) and len(times.word_arrivals_ns) == len(WORDS)
    _, short_times = run(synthesize_words(bundle, ["Run", "this:", SEGMENT_BREAK, "then", "more", "words."], "s5", 200.0, config=config))
    assert short_times.start_allowed_ns is not None and short_times.start_allowed_ns <= short_times.word_arrivals_ns[2]
