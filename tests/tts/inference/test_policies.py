"""Each regime's policy on its own: a fake stream (the mechanics a policy reads and calls, with an injected clock)
and fake units, no model. What a policy decides: which words make which unit and when it opens, when a held
opening plays, how many frames may wait for a render, when a full-context chunk leaves."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tts.inference.policies import FullContext, Sentence, WordStreaming, policy_for
from tts.inference.stream_parts import SEGMENT_BREAK, UnitCutter
from tts.inference.tuning import TUNING


@dataclass
class FakeUnit:
    words: list[str] = field(default_factory=list)
    ended: bool = False
    frames: list = field(default_factory=list)
    finished: bool = False
    current: int = 1
    lookahead_in: bool = False  # the words its next word needs have arrived

    def ready(self) -> bool:
        return self.lookahead_in

    def push_words(self, words: list[str]) -> None:
        self.words += words

    def end(self) -> None:
        self.ended = True


class FakeStream:
    """The mechanics a policy sees (`policies.StreamSchedule`), with numbers a test sets."""

    def __init__(self, now_ns: int = 0, eager: bool = True):
        self.tuning, self.now_ns = TUNING, now_ns
        self.clock = lambda: self.now_ns
        self.emit_every, self.held_words, self.opening_first_render = 3, [], 4
        self.eager_opening, self.opening_ready, self.hold_until_ns = eager, False, None
        self.emitted_s, self.first_sent_ns = 0.0, None
        self.step_s, self.render_s, self.rendered_frames = 0.005, 0.010, 2
        self.units: list[FakeUnit] = []
        self.ahead, self.unsent, self.unrendered, self.interval_ns, self.word_free = None, 0.0, 0.0, None, False
        self.rendered, self.sent = 0, 0

    front = property(lambda self: self.units[0] if self.units else None)
    last_unit_ended = property(lambda self: not self.units or self.units[-1].ended)

    def new_unit(self, words, complete):
        self.units.append(FakeUnit(list(words), ended=complete))
        return self.units[-1]

    def open_unit(self):
        return self.new_unit([], False) if self.last_unit_ended else self.units[-1]

    def decode(self, unit, max_frames=None, stop_at_word=False):
        unit.frames += [object()] * (max_frames or 1)
        yield from ()
        return []

    def pending(self, unit):
        return len(unit.frames) - self.rendered

    def render(self, unit):
        self.rendered = len(unit.frames)

    def render_steps(self, unit):
        self.render(unit)
        yield from ()

    def take_chunk(self):
        self.sent += 1
        return "chunk"

    def emit(self, unit):
        self.render(unit)
        return self.take_chunk()

    ahead_s = lambda self: self.ahead  # noqa: E731
    unsent_s = lambda self: self.unsent  # noqa: E731
    unrendered_s = lambda self, unit: self.unrendered  # noqa: E731
    next_word_free = lambda self, unit: self.word_free  # noqa: E731
    text_interval_ns = lambda self: self.interval_ns  # noqa: E731


def cut(words: list[str]) -> list[tuple[str, bool]]:
    """Words as the inbox hands them over: each with whether it ends its unit."""
    cutter = UnitCutter()
    return [(word, cutter.cut(word)) for word in words]


def run(generator):
    try:
        while True:
            next(generator)
    except StopIteration as stop:
        return stop.value


def test_word_streaming_opens_units_as_words_come_and_closes_them_at_their_end():
    stream, policy = FakeStream(), WordStreaming()
    policy.take_words(stream, cut(["Sure!", "The", "pump"]), ending=False)
    assert [(u.words, u.ended) for u in stream.units] == [(["Sure!"], True), (["The", "pump"], False)]
    policy.take_words(stream, cut(["runs", SEGMENT_BREAK, "Then"]), ending=False)  # a break ends the open unit
    assert [(u.words, u.ended) for u in stream.units][1:] == [(["The", "pump", "runs"], True), (["Then"], False)]
    policy.take_words(stream, [], ending=True)  # the end closes the last unit without waiting for lookahead
    assert stream.units[-1].ended and len(stream.units) == 3


@pytest.mark.parametrize("policy, opened_before_end", [(FullContext(), []), (Sentence(), [["Hi", "there."]])])
def test_full_context_waits_for_the_end_and_sentence_for_each_sentence(policy, opened_before_end):
    stream = FakeStream()
    policy.take_words(stream, cut(["Hi", "there.", "How", "are"]), ending=False)
    assert [u.words for u in stream.units] == opened_before_end and all(u.ended for u in stream.units)
    policy.take_words(stream, cut(["you?"]), ending=True)
    assert [u.words for u in stream.units] == [["Hi", "there."], ["How", "are", "you?"]] and not stream.held_words


def test_full_context_emits_every_n_steps_and_at_the_unit_end():
    stream, policy = FakeStream(), FullContext()
    unit = FakeUnit(["Hi."], ended=True)
    assert run(policy.advance(stream, unit)) == "chunk" and stream.rendered == 3  # emit_every = 3 frames
    unit.finished = True
    unit.frames.append(object())  # one more frame decoded, then the unit finished: it leaves though short
    assert run(policy.advance(stream, unit)) == "chunk"


def test_a_held_opening_plays_when_the_text_comes_or_its_time_is_up():
    stream, policy = FakeStream(now_ns=1_000), WordStreaming()
    unit = FakeUnit(["Your"])
    stream.hold_until_ns = 5_000
    assert not policy.release_hold(stream, unit, 2_000)
    assert policy.release_hold(stream, unit, 5_000)  # the hold's time is up
    unit.lookahead_in = True
    assert policy.release_hold(stream, unit, 2_000)  # the next word's text is in
    stream.units, stream.opening_ready = [unit], True
    assert not policy.sound_first(stream)
    stream.word_free = True
    assert policy.sound_first(stream)


def test_alone_chunks_grow_with_the_sound_ahead_and_slow_text_renders_words_whole():
    stream = FakeStream()
    stream.ahead = 0.3
    frame_cost = stream.step_s + stream.render_s / stream.rendered_frames  # 10 ms a frame
    assert WordStreaming._affordable_frames(stream) == int(0.3 / (TUNING.opening_margin * frame_cost)) == 15
    stream.ahead = 1.2
    assert WordStreaming._affordable_frames(stream) == 60
    stream.interval_ns = int(0.5e9)  # two words a second: paced, words render whole
    assert WordStreaming._affordable_frames(stream) is None
    assert WordStreaming._affordable_frames(FakeStream(eager=False)) is None  # among others: not this rule


def test_among_others_words_render_together_only_while_the_player_is_well_supplied():
    stream = FakeStream(eager=False)
    unit = FakeUnit(["a"])
    stream.emitted_s, stream.first_sent_ns = 1.0, 0
    stream.ahead, stream.unrendered = TUNING.shared_ahead_s + 0.5, 0.2
    assert WordStreaming._renders_together(stream, unit)
    stream.ahead = TUNING.shared_ahead_s - 0.1
    assert not WordStreaming._renders_together(stream, unit)
    stream.ahead, stream.unrendered = TUNING.shared_ahead_s + 0.5, TUNING.shared_render_s
    assert not WordStreaming._renders_together(stream, unit)  # a render holds at most this much


def test_policy_for_each_mode():
    assert [type(policy_for(m)) for m in ("s5", "t5", "sentence")] == [WordStreaming, FullContext, Sentence]
    assert WordStreaming.paces and not FullContext.paces
