"""The engine's schedule without a thread or an event loop: words into its inbox, `work()` called until done.
Synthesis units: where a reply is cut, and that each unit runs with fresh state."""
import numpy as np
import pytest
import torch

from tts.inference.schedule import StreamSchedule
from tts.inference.stream_parts import Inbox, UtteranceTimes, ends_unit, split_units
from tts.inference.synthesis import SynthesisConfig, run_steps
from tts.inference.tuning import TUNING

CLAUSE_UNIT_WORDS, MAX_UNIT_WORDS = TUNING.clause_unit_words, TUNING.max_unit_words

LONG_SENTENCE = ("When the weather turns cold the pump runs backwards, pulling warmth out of the outdoor air, "
                 "which still holds some heat even below freezing, and pushing it into the house through the "
                 "same coils that cool it in summer.").split()


def test_units_end_at_sentences_and_at_clauses_of_long_sentences():
    assert ends_unit(1, "Sure!") and ends_unit(3, "today?") and ends_unit(2, 'said."')
    assert not ends_unit(3, "there,") and ends_unit(CLAUSE_UNIT_WORDS, "there,")
    assert ends_unit(MAX_UNIT_WORDS, "and") and not ends_unit(MAX_UNIT_WORDS - 1, "and")
    assert split_units("Hi! How are you? Fine.".split()) == [["Hi!"], ["How", "are", "you?"], ["Fine."]]
    units = split_units(LONG_SENTENCE)
    assert [w for u in units for w in u] == LONG_SENTENCE  # nothing lost, nothing repeated
    assert len(units) == 2 and units[0][-1] == "air," and all(len(u) <= MAX_UNIT_WORDS for u in units)
    assert split_units(["word"] * 70) == [["word"] * 30, ["word"] * 30, ["word"] * 10]
    assert split_units([]) == []


class TickClock:
    """A microsecond a call: model work takes no time; a test moves it on to when a waiting stream may go on."""

    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        self.now += 1000
        return self.now


def drive(schedule: StreamSchedule, limit: int = 10_000, waits: list | None = None, run=run_steps) -> list:
    """Call work() until the schedule is done or idle; the chunks it sent. On a tick clock, a "wait" moves the
    clock on to the schedule's `resume_at_ns` (noted in `waits`: the seconds of sound ahead when it goes on).
    `run` drives each call's steps (`run_steps`: as `work()`, each render waited for)."""
    chunks = []
    for _ in range(limit):
        chunk, state = run(schedule.work_steps())
        if chunk is not None:
            chunks.append(chunk)
        if state == "wait" and isinstance(schedule.clock, TickClock):
            schedule.clock.now = schedule.resume_at_ns
            if waits is not None:
                waits.append(schedule.ahead_s())
            continue
        if state in ("done", "idle", "wait"):
            return chunks
    raise AssertionError("the schedule never finished")


def schedule_for(bundle, mode: str, words: list[str], end: bool = True, frames_per_word: int = 4) -> StreamSchedule:
    inbox = Inbox(UtteranceTimes())
    schedule = StreamSchedule(bundle, mode, SynthesisConfig(seed=5, max_frames_per_word=frames_per_word), 8, inbox,
                              max_stretch=1.0)
    for word in words:
        inbox.put_word(word)
    if end:
        inbox.end()
    return schedule


def shared_schedule(bundle, words: list[str], end: bool = True, frames_per_word: int = 4) -> StreamSchedule:
    """An s5 stream on a tick clock with another stream live on its worker (as `schedule_for`, among others)."""
    from tts.inference.batching import StreamWorker

    worker = StreamWorker()
    worker.join()  # another stream is live...
    worker.join()  # ...beside this one (its driver would join it)
    inbox = Inbox(UtteranceTimes(), clock=TickClock())
    schedule = StreamSchedule(bundle, "s5", SynthesisConfig(seed=5, max_frames_per_word=frames_per_word), 8, inbox,
                              max_stretch=1.0, shared=worker)
    for word in words:
        inbox.put_word(word)
    if end:
        inbox.end()
    return schedule


def rendered_lengths(monkeypatch, schedule: StreamSchedule) -> tuple[list[int], list[int]]:
    """From now on, the frames of each render `schedule` runs (its last audio, the codec's flush, not counted): the
    lists of those before its first sound is sent and of those after, filled as it runs."""
    from tts.inference.synthesis import RenderRequest

    before, after = [], []
    run = RenderRequest.run

    def counted(request):
        if not request.final:
            (before if schedule.first_sent_ns is None else after).append(request.codes.shape[1])
        return run(request)

    monkeypatch.setattr(RenderRequest, "run", counted)
    return before, after


def test_each_unit_starts_with_fresh_state_and_modes_cut_the_same_units(tiny_bundle):
    """A reply of several sentences, one long: s5 (all words in, then the end) and t5 open the same units, each a new
    synthesizer with its own decoder; both speak every word once, in order, with the same codes."""
    bundle = tiny_bundle(2)
    words = "Sure thing! ".split() + LONG_SENTENCE + "That is all.".split()
    s5 = schedule_for(bundle, "s5", words)
    first, _ = s5.work()  # takes the words: every unit is opened at once
    opened = s5.units
    assert [u.words for u in opened] == [u for u in split_units(words)]
    assert len({id(u.decoder) for u in opened}) == len(opened)  # a fresh decoder (caches, alignment) per unit
    assert all(u.ended for u in opened) and all(u.current == 1 for u in opened[1:])
    s5_chunks = [first] * (first is not None) + drive(s5)
    t5_chunks = drive(schedule_for(tiny_bundle(2), "t5", words))
    assert [w for c in s5_chunks for w in c.words] == words
    codes = [torch.cat([c.codes for c in chunks if c.codes is not None], dim=1) for chunks in (s5_chunks, t5_chunks)]
    assert torch.equal(*codes)
    assert s5.units == []  # every unit sent and dropped


def test_a_finished_sentence_is_spoken_without_waiting_for_lookahead_words(tiny_bundle):
    """"Sure!" then nothing yet: the unit is complete, so its word is decoded and voiced although k = 2 words of
    lookahead never came; the next sentence waits for its own k + 1 words."""
    bundle = tiny_bundle(2)
    schedule = schedule_for(bundle, "s5", ["Sure!", "The", "pump"], end=False)
    chunks = drive(schedule)
    assert [w for c in chunks for w in c.words] == ["Sure!"]
    assert sum(c.frames for c in chunks) > 0
    assert [u.words for u in schedule.units] == [["The", "pump"]] and not schedule.units[0].ready()
    schedule.inbox.put_word("moves")
    drive(schedule)  # until idle again
    unit = schedule.units[0]
    assert unit.words == ["The", "pump", "moves"]
    assert unit.current == 2 and unit.frames  # word 1 had its k = 2 lookahead words; word 2 waits for word 4


def test_alone_the_first_chunk_lasts_at_least_the_opening_floor(tiny_bundle):
    """Alone, with steps and renders that cost next to nothing (a tick clock), the opening would let its first frame
    go as soon as it sounds; it renders on until `opening_min_sound_s` is in the chunk (a step on a shared VM can
    take four times the last one); a higher floor holds it longer, and without one it goes sooner."""
    from dataclasses import replace

    words = "Water boils at one hundred degrees at sea level.".split()

    def first_chunk_s(tuning) -> float:
        inbox = Inbox(UtteranceTimes(), clock=TickClock())
        schedule = StreamSchedule(tiny_bundle(2), "s5", SynthesisConfig(seed=5, max_frames_per_word=6), 8, inbox,
                                  max_stretch=1.0, tuning=tuning)
        for word in words:
            inbox.put_word(word)
        inbox.end()
        first = drive(schedule)[0]
        return len(first.samples) / schedule.sample_rate

    assert first_chunk_s(TUNING) >= TUNING.opening_min_sound_s
    assert first_chunk_s(replace(TUNING, opening_min_sound_s=0.3)) >= 0.3
    assert first_chunk_s(replace(TUNING, opening_min_sound_s=0.0)) < 0.3


def test_among_other_streams_words_are_rendered_together_once_the_player_is_well_supplied(tiny_bundle):
    """With another stream live on the batcher, a stream spends fewer, larger renders: no frame-by-frame opening,
    a first chunk of at least `shared_first_chunk_s`, and, once more than `shared_ahead_s` of sound is ahead of the
    player, several words per render. The codes are the same as alone: only the rendering is grouped."""
    words = ("The pump moves warmth from the cold air outside into the warm house and back again in summer when "
             "the days are long").split()
    alone = drive(schedule_for(tiny_bundle(2), "s5", words))
    bundle = tiny_bundle(2)
    shared = shared_schedule(bundle, words)
    waits = []
    together = drive(shared, waits=waits)
    assert not shared.eager_opening
    # far ahead of its player, it let the others go first, and went on once SHARED_LEAD_S was ahead
    assert waits and all(abs(ahead - TUNING.shared_lead_s) < 1e-3 for ahead in waits)
    assert len(together[0].samples) / bundle.codec.sample_rate >= TUNING.shared_first_chunk_s
    assert len(together) < len(alone) and max(len(c.words) for c in together[1:]) > 1
    codes = [torch.cat([c.codes for c in chunks if c.codes is not None], dim=1) for chunks in (alone, together)]
    assert torch.equal(*codes)



def test_the_first_frame_is_stamped_as_it_is_decoded_not_when_the_call_ends(tiny_bundle):
    """`UtteranceTimes.first_codec_frame_ns` (a turn record's stamp, `SpeechResult.opening_ms`) marks the first
    frame's step, though the call goes on decoding (among other streams, up to `steps_per_work` frames a call)."""
    from tts.inference.synthesis import StepRequest
    from tts.model.incremental import decode_step

    schedule = shared_schedule(tiny_bundle(2), "I am so glad to see you here today.".split())
    steps_sent = []  # the clock as each step's output goes back to the call

    def run(work):
        try:
            request = next(work)
            while True:
                if isinstance(request, StepRequest):
                    output = decode_step(request.state, request.codes, request.words)
                    steps_sent.append(schedule.clock.now)
                else:
                    output = request.run()
                request = work.send(output)
        except StopIteration as stop:
            return stop.value

    run(schedule.work_steps())
    assert len(steps_sent) >= 3
    assert steps_sent[0] < schedule.times.first_codec_frame_ns <= steps_sent[1]

def test_among_other_streams_one_render_voices_the_opening(tiny_bundle, monkeypatch):
    """Among other streams, words short of a first chunk (`shared_first_chunk_s`) are not rendered one by one before
    the first sound: the stream decodes on, and one render voices the whole first chunk, which leaves with it."""
    words = "I am so glad to see you here today, my old friend from the city.".split()
    alone = drive(schedule_for(tiny_bundle(2), "s5", words, frames_per_word=2))
    shared = shared_schedule(tiny_bundle(2), words, frames_per_word=2)
    before_sound, _ = rendered_lengths(monkeypatch, shared)
    together = drive(shared)
    assert len(before_sound) == 1  # word by word, this opening took several renders
    assert len(together[0].samples) / shared.sample_rate >= TUNING.shared_first_chunk_s
    codes = [torch.cat([c.codes for c in chunks if c.codes is not None], dim=1) for chunks in (alone, together)]
    assert torch.equal(*codes)


def test_among_other_streams_renders_are_whole_quanta_and_chunks_name_only_rendered_words(tiny_bundle, monkeypatch):
    """Among other streams, once its first sound is sent, a render is a whole multiple of `shared_render_quantum`
    frames (the rest waits for the next render) except a unit's last, so that the renders due together share their
    passes; the codes are those of the stream alone, and a chunk names a word only once all of the word's frames
    are in it or before it."""
    words = "The pump moves warmth from the cold air outside. Then it runs backwards in the summer heat.".split()
    alone = drive(schedule_for(tiny_bundle(2), "s5", words, frames_per_word=3))
    shared = shared_schedule(tiny_bundle(2), words, frames_per_word=3)
    _, lengths = rendered_lengths(monkeypatch, shared)  # past the opening
    ends, word_done = [], shared.timeline.word_done

    def noting_ends(word, frames):
        span = word_done(word, frames)
        ends.append(span[1])
        return span

    shared.timeline.word_done = noting_ends
    together = drive(shared)
    quantum = TUNING.shared_render_quantum
    units = 2
    assert quantum > 1 and len(lengths) > units
    assert sum(n % quantum != 0 for n in lengths) <= units  # only a unit's last render may be another length
    codes = [torch.cat([c.codes for c in chunks if c.codes is not None], dim=1) for chunks in (alone, together)]
    assert torch.equal(*codes)
    frames, spoken = 0, []
    for chunk in together:
        frames += chunk.frames
        spoken += chunk.words
        assert all(end <= frames for end in ends[: len(spoken)])  # each word named has all its frames sent
    assert spoken == words and len(ends) == len(words)


def test_among_other_streams_a_stream_running_dry_still_renders_whole_quanta(tiny_bundle, monkeypatch):
    """A stream whose player is about to run dry (less than a quantum of sound ahead) renders whole quanta too when
    it has a quantum pending, the rest waiting for the next word: on a loaded server every stream is short of sound,
    and renders of odd lengths (a pass each for their 2- and 1-frame pieces) are what kept them short. Only what is
    less than a quantum goes as it is; the codes are the stream's own."""
    words = "The pump moves warmth from the cold air outside. Then it runs backwards in the summer heat.".split()
    alone = drive(schedule_for(tiny_bundle(2), "s5", words, frames_per_word=6))
    shared = shared_schedule(tiny_bundle(2), words, frames_per_word=6)
    _, lengths = rendered_lengths(monkeypatch, shared)  # past the opening
    monkeypatch.setattr(shared, "ahead_s", lambda: None if shared.first_sent_ns is None else 0.0)  # always dry
    together = drive(shared)
    quantum, units = TUNING.shared_render_quantum, 2
    assert any(n >= quantum for n in lengths)
    assert sum(n % quantum != 0 and n > quantum for n in lengths) <= units  # a unit's last render may be any length
    codes = [torch.cat([c.codes for c in chunks if c.codes is not None], dim=1) for chunks in (alone, together)]
    assert torch.equal(*codes)


class OverlappingRenders:
    """Drives a call's steps as a worker with a render thread (`run` for `drive`): an overlapping render comes back
    `steps_per_render` decoder steps after it was asked for (at once if the stream waits for it); `overlapped`
    counts the steps run while a render ran."""

    def __init__(self, steps_per_render: int):
        self.steps_per_render, self.overlapped = steps_per_render, 0

    def __call__(self, work):
        from tts.inference.synthesis import PendingRender, RenderRequest, StepRequest
        from tts.model.incremental import decode_step

        in_flight = None  # (pending, its request, steps since)
        try:
            request = next(work)
            while True:
                if isinstance(request, StepRequest):
                    output = decode_step(request.state, request.codes, request.words)
                    if in_flight is not None and not in_flight[0].done:
                        self.overlapped += 1
                        in_flight[2] += 1
                        if in_flight[2] == self.steps_per_render:
                            in_flight[0].audio, in_flight[0].done = in_flight[1].run(), True
                elif isinstance(request, PendingRender):  # the stream waits for its render
                    assert request is in_flight[0] and not request.done
                    output = in_flight[1].run()
                elif isinstance(request, RenderRequest) and request.overlap:
                    assert in_flight is None or in_flight[0].done  # one render at a time, in order
                    in_flight = [PendingRender(), request, 0]
                    output = in_flight[0]
                else:
                    output = request.run()
                request = work.send(output)
        except StopIteration as stop:
            return stop.value


@pytest.mark.parametrize("steps_per_render", [1, 3, 50])
def test_among_other_streams_a_stream_decodes_on_while_its_render_runs(tiny_bundle, steps_per_render):
    """Once it has sounded, a stream among others hands its render to the render thread and decodes its next frames
    meanwhile (waiting idle, half the streams sat out each decoder pass): it speaks its own codes, every frame and
    word once, whether its renders come back after one step, a few, or only when it waits for them."""
    words = "The pump moves warmth from the cold air outside. Then it runs backwards in the summer heat.".split()
    alone = drive(schedule_for(tiny_bundle(2), "s5", words, frames_per_word=6))
    shared = shared_schedule(tiny_bundle(2), words, frames_per_word=6)
    overlapping = OverlappingRenders(steps_per_render)
    together = drive(shared, run=overlapping)
    assert overlapping.overlapped > 0
    codes = [torch.cat([c.codes for c in chunks if c.codes is not None], dim=1) for chunks in (alone, together)]
    assert torch.equal(*codes)
    assert sum(c.frames for c in together) == codes[1].shape[1]
    assert [w for c in together for w in c.words] == [w for c in alone for w in c.words]
    samples = [np.concatenate([c.samples for c in chunks]) for chunks in (alone, together)]
    assert len(samples[0]) == len(samples[1]) and np.allclose(*samples, atol=1e-4)
    # alone on such a worker a stream sizes its chunks by what it can afford, and waits for its renders
    overlapping = OverlappingRenders(steps_per_render)
    by_itself = drive(schedule_for(tiny_bundle(2), "s5", words, frames_per_word=6), run=overlapping)
    assert overlapping.overlapped == 0 and [w for c in by_itself for w in c.words] == [w for c in alone for w in c.words]


def test_among_other_streams_held_frames_go_out_when_the_text_pauses(tiny_bundle):
    """Frames held for a whole render quantum (or for the next word's) are not left unheard while the text pauses:
    once the stream has nothing to decode until more words come, everything decoded is rendered and sent."""
    words = "the pump moves warmth from the cold air outside into the warm house and back again".split()
    shared = shared_schedule(tiny_bundle(2), words, end=False, frames_per_word=3)  # the text pauses after these
    chunks = drive(shared)
    unit = shared.front
    assert chunks and shared.emitted_s > 0 and not unit.ready()
    assert shared.pending(unit) == 0  # nothing decoded waits unrendered...
    assert sum(c.frames for c in chunks) == len(unit.frames)  # ...or unsent


@pytest.mark.parametrize("render_ms, render_frame_ms, step_ms", [(15, 10, 0), (11, 14, 10), (11, 20, 12), (15, 25, 10)])
def test_alone_a_vocoder_with_costly_renders_opens_eagerly_and_never_leaves_the_player_dry(
        tiny_bundle, monkeypatch, render_ms, render_frame_ms, step_ms):
    """HiFi-GAN's renders cost several times the iSTFT vocoder's (15 ms + 10 ms a codec frame, as V1 streamed in
    bfloat16 on one thread; 11 ms + 14 ms a frame and a 10 ms decoder step, as in float32 on AVX-512; 11 + 20 and
    12, AVX2; a slower machine, where fixed-size small chunks ran the player dry): alone, the stream still opens
    frame by frame, sends its first sound before the 0.3 s that streams among others hold, and each chunk leaves
    before the player has played everything sent before it."""
    from tts.codec.mel_codec import MelCodec
    from tts.codec.vocoder import Generator, Vocoder, VocoderConfig
    from tts.inference.synthesis import TTSBundle, UtteranceSynthesizer

    tiny = tiny_bundle(2)
    hifigan = Vocoder(Generator(VocoderConfig(upsample_initial_channel=16)))
    costly = TTSBundle(tiny.model, tiny.symbols, MelCodec(tiny.codec.model, hifigan), tiny.g2p)
    clock = TickClock()
    steps = UtteranceSynthesizer.steps

    def costly_steps(unit, **kwargs):
        decoded = len(unit.frames)
        completed = yield from steps(unit, **kwargs)
        clock.now += step_ms * 1_000_000 * (len(unit.frames) - decoded)
        return completed

    monkeypatch.setattr(UtteranceSynthesizer, "steps", costly_steps)
    inbox = Inbox(UtteranceTimes(), clock=clock)
    schedule = StreamSchedule(costly, "s5", SynthesisConfig(seed=5, max_frames_per_word=4), 8, inbox, max_stretch=1.0)
    assert schedule.eager_opening
    push = schedule._codec_stream.push

    def costly_push(codes, stretch=1.0):
        clock.now += (render_ms + render_frame_ms * codes.shape[1]) * 1_000_000
        return push(codes, stretch)

    schedule._codec_stream.push = costly_push
    for word in "Good morning, my friend, how are you today?".split():
        inbox.put_word(word)
    inbox.end()
    sent = []  # (when, seconds of sound)
    while True:
        chunk, state = schedule.work()
        if chunk is not None and len(chunk.samples):
            sent.append((clock.now, len(chunk.samples) / costly.codec.sample_rate))
        if state == "done":
            break
    assert len(sent) > 3 and sent[0][1] < TUNING.shared_first_chunk_s
    first_ns, played_s = sent[0][0], 0.0
    for when_ns, seconds in sent:
        assert when_ns <= first_ns + played_s * 1e9  # the player still had sound when this chunk came
        played_s += seconds


def test_a_stream_that_starts_alone_shares_once_another_joins(tiny_bundle):
    """A stream alone on the worker opens eagerly; once another stream is live its next call gives that up for
    good (word-sized renders, no chunks sized for a core of its own), and it speaks the same codes."""
    from tts.inference.batching import StreamWorker

    words = "The pump moves warmth from the cold air outside into the warm house and back again".split()
    alone = drive(schedule_for(tiny_bundle(2), "s5", words))
    bundle = tiny_bundle(2)
    worker = StreamWorker()
    worker.join()  # this stream, alone
    inbox = Inbox(UtteranceTimes(), clock=TickClock())
    schedule = StreamSchedule(bundle, "s5", SynthesisConfig(seed=5, max_frames_per_word=4), 8, inbox,
                              max_stretch=1.0, shared=worker)
    for word in words:
        inbox.put_word(word)
    inbox.end()
    assert schedule.eager_opening
    schedule.work()
    assert schedule.eager_opening  # still alone
    worker.join()  # another stream starts
    joined = drive(schedule)
    assert not schedule.eager_opening
    worker.leave()  # the other one ends: this stream does not go back to a core of its own
    assert not schedule.eager_opening
    codes = [torch.cat([c.codes for c in chunks if c.codes is not None], dim=1) for chunks in (alone, joined)]
    assert torch.equal(codes[0][:, -codes[1].shape[1]:], codes[1])
