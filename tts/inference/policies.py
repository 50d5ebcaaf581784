"""One small policy per regime: what a stream's front synthesis unit does next. The mechanics (what is decoded,
rendered, sent; the player's clock) are the schedule's (`tts/inference/schedule.py`); a policy holds no state of
its own, reads the schedule's and calls its operations, so one policy object serves every stream of its mode.

- `WordStreaming` (s5): word n is generated once word n + k has arrived; alone on the cores it opens eagerly
  (renders frame by frame until the first chunk outlasts the next piece of work, holds a short opening word for
  the next one's text) and then sizes chunks by the sound ahead of the player; among other streams it renders
  words together while the player is well supplied.
- `FullContext` (t5): waits for the whole text, then speaks unit by unit, a chunk every `emit_every` steps.
- `Sentence`: the full-context model per sentence, as most voice pipelines run TTS.

The numbers they decide by are `tts/inference/tuning.py`'s. Thread: the schedule's worker thread, as the schedule.
The schedule is typed here by what a policy uses of it (`StreamSchedule` below), so this module needs nothing of
the schedule's and the schedule imports it.
"""
from __future__ import annotations

from typing import Callable, Protocol

from tts.inference.stream_parts import SEGMENT_BREAK, AudioChunk, Pacer
from tts.inference.synthesis import Steps, UtteranceSynthesizer
from tts.inference.tuning import StreamTuning


class StreamSchedule(Protocol):
    """What a policy reads of a stream and may ask of it: the mechanics `tts/inference/schedule.py` implements."""
    tuning: StreamTuning
    clock: Callable[[], int]
    emit_every: int  # full context: decoder steps per chunk
    held_words: list[list[str]]  # full context: units whose words wait
    opening_first_render: int  # decoder steps before the first render
    eager_opening: bool  # alone on the cores
    opening_ready: bool  # the opening's sound is rendered (set by the policy)
    hold_until_ns: int | None  # a short opening word waits until then (set by the policy)
    emitted_s: float
    first_sent_ns: int | None
    frame_rate: float
    step_s: float  # the last decoder step's time
    render_s: float  # the last render's time...
    rendered_frames: int  # ...and frames
    front: UtteranceSynthesizer | None
    last_unit_ended: bool

    def new_unit(self, words: list[str], complete: bool) -> UtteranceSynthesizer: ...
    def open_unit(self) -> UtteranceSynthesizer: ...
    def decode(self, unit: UtteranceSynthesizer, **steps) -> Steps[list]: ...
    def pending(self, unit: UtteranceSynthesizer) -> int: ...
    def render(self, unit: UtteranceSynthesizer) -> None: ...
    def render_steps(self, unit: UtteranceSynthesizer, frames: int | None = None, overlap: bool = False) -> Steps[None]: ...
    def take_completed_ahead(self) -> bool: ...
    def emit(self, unit: UtteranceSynthesizer) -> AudioChunk | None: ...
    def take_chunk(self) -> AudioChunk | None: ...
    def ahead_s(self) -> float | None: ...
    def unsent_s(self) -> float: ...
    def unrendered_s(self, unit: UtteranceSynthesizer) -> float: ...
    def next_word_free(self, unit: UtteranceSynthesizer) -> bool: ...
    def text_interval_ns(self) -> int | None: ...


class Policy:
    """The decisions of one regime; the defaults are full context's."""
    paces = False  # slow text is spoken slower (`Pacer`) rather than with gaps

    def sound_first(self, schedule: StreamSchedule) -> bool:
        """Before taking new words: is rendered sound waiting only for text that has now come in?"""
        return False

    def take_words(self, schedule: StreamSchedule, words: list[tuple[str, bool]], ending: bool) -> None:
        """Words from the inbox (each with whether it ends its unit) into units; `ending`: the text ended now."""
        raise NotImplementedError

    def release_hold(self, schedule: StreamSchedule, unit: UtteranceSynthesizer, now_ns: int) -> bool:
        """Is a held opening word to be played now?"""
        return False

    def advance(self, schedule: StreamSchedule, unit: UtteranceSynthesizer) -> Steps[AudioChunk | None]:
        """Decode a few frames of the front unit and return the chunk that may leave (None: none yet)."""
        raise NotImplementedError


class FullContext(Policy):
    """t5: every word known before the first is decoded; units in order, each with full context."""
    per_sentence = False  # sentence mode opens each unit as soon as its last word is in

    def take_words(self, schedule: StreamSchedule, words: list[tuple[str, bool]], ending: bool) -> None:
        held = schedule.held_words  # units whose words wait, the last one filling
        for word, ends in words:
            if word == SEGMENT_BREAK:
                self._open_held(schedule)
                continue
            if not held:
                held.append([])
            held[-1].append(word)
            if ends and self.per_sentence:
                self._open_held(schedule)
            elif ends:
                held.append([])
        if ending:
            self._open_held(schedule)

    @staticmethod
    def _open_held(schedule: StreamSchedule) -> None:
        for words in schedule.held_words:
            if words:
                schedule.new_unit(words, complete=True)
        schedule.held_words.clear()

    def advance(self, schedule: StreamSchedule, unit: UtteranceSynthesizer) -> Steps[AudioChunk | None]:
        yield from schedule.decode(unit, max_frames=schedule.emit_every - schedule.pending(unit))
        if schedule.pending(unit) >= schedule.emit_every or unit.finished:
            yield from schedule.render_steps(unit)
            return schedule.take_chunk()
        return None


class Sentence(FullContext):
    """sentence: a unit starts once its last word is in."""
    per_sentence = True


class WordStreaming(Policy):
    """s5: word by word with k words of lookahead."""
    paces = True

    def take_words(self, schedule: StreamSchedule, words: list[tuple[str, bool]], ending: bool) -> None:
        run: list[str] = []
        for word, ends in words + [(SEGMENT_BREAK, True)] * ending:  # the end: a last break
            if word != SEGMENT_BREAK:
                run.append(word)
                if not ends:
                    continue
            elif not run and schedule.last_unit_ended:
                continue  # a break with no unit open: nothing to end
            unit = schedule.open_unit()
            unit.push_words(run)  # arrived together: one encoder pass
            run = []
            if unit.words or ending or word != SEGMENT_BREAK:
                unit.end()  # the unit is complete: its last words need no lookahead past it
        if run:
            schedule.open_unit().push_words(run)

    def sound_first(self, schedule: StreamSchedule) -> bool:
        front = schedule.front
        return schedule.opening_ready and front is not None and schedule.next_word_free(front)

    def release_hold(self, schedule: StreamSchedule, unit: UtteranceSynthesizer, now_ns: int) -> bool:
        return schedule.hold_until_ns is not None and (now_ns >= schedule.hold_until_ns or unit.ready())

    def advance(self, schedule: StreamSchedule, unit: UtteranceSynthesizer) -> Steps[AudioChunk | None]:
        if self._in_opening(schedule):
            return (yield from self._opening(schedule, unit))
        tuning = schedule.tuning
        budget = self._affordable_frames(schedule)
        steps = tuning.steps_per_work
        if budget is not None:
            steps = max(1, min(steps, budget - schedule.pending(unit)))
        completed = yield from schedule.decode(unit, max_frames=steps, stop_at_word=True)
        emit = (bool(completed) or schedule.take_completed_ahead() or unit.finished
                or (budget is not None and schedule.pending(unit) >= budget))
        if emit and (self._renders_together(schedule, unit) or self._opening_short(schedule, unit)):
            emit = False
        if not emit:
            return None
        frames = self._shared_render_frames(schedule, unit)
        if frames == 0:
            return None
        # among other streams, rendered in one pass with theirs; once sound plays, on a worker with a render
        # thread, the unit decodes on meanwhile (alone, the stream sizes its chunks by what it can afford instead)
        yield from schedule.render_steps(unit, frames, overlap=bool(schedule.emitted_s) and not schedule.eager_opening)
        # a render may give less sound than estimated (a dropped leading silence): still short, the opening waits
        return None if self._opening_short(schedule, unit) else schedule.take_chunk()

    # ---- alone: the opening ----------------------------------------------------------------------------
    @staticmethod
    def _in_opening(schedule: StreamSchedule) -> bool:
        """Alone, LLM-speed text, no sound has left yet: the opening word is rendered as it is decoded, and its
        sound leaves as soon as nothing can make it wait (slow text: the pacer decides how the opening plays)."""
        return schedule.eager_opening and not schedule.emitted_s and not Pacer.paces(schedule.text_interval_ns())

    @staticmethod
    def _opening(schedule: StreamSchedule, unit: UtteranceSynthesizer) -> Steps[AudioChunk | None]:
        """Decode a step (the first call: the steps before the first sound can be rendered), render at once, and
        let the sound go when the word after the opening one may follow at once (its text is in, or the text
        ended) or the opening word is long (`short_opening_s`); a short opening word whose successor waits for
        text is held until that text is in, at most `max_opening_hold_s`. Once the sound is ready, the calls that
        wait for that text decode a step each without rendering, so that `work` lets it go within a step of the
        text's arrival."""
        tuning = schedule.tuning
        yield from schedule.decode(unit, max_frames=max(1, schedule.opening_first_render - len(unit.frames)),
                                   stop_at_word=True)
        if not schedule.opening_ready:
            schedule.render(unit)
            # the first chunk must last while the next is made (a step and a render, at this moment's speed: an
            # LLM on the same cores can make both several times slower)
            next_work_s = schedule.step_s + schedule.render_s
            sound_s = schedule.unsent_s()
            # and at least `opening_min_sound_s` where more can be decoded now (else the text is late: the hold decides)
            floor_s = tuning.opening_min_sound_s if unit.ready() else 0.0
            enough_s = max(floor_s, tuning.opening_margin * next_work_s)
            schedule.opening_ready = sound_s > 0 and (sound_s >= enough_s or unit.finished)
        emit = schedule.opening_ready and (unit.finished or schedule.next_word_free(unit)
                                           or schedule.unrendered_s(unit) >= tuning.short_opening_s)
        if schedule.opening_ready and unit.current > 1 and not emit and schedule.hold_until_ns is None:
            schedule.hold_until_ns = schedule.clock() + round(tuning.max_opening_hold_s * 1e9)
        if not emit:
            return None
        # what is rendered leaves now; frames decoded since wait for the next call's render (a finished unit has
        # no next call)
        return schedule.emit(unit) if unit.finished else schedule.take_chunk()

    @staticmethod
    def _affordable_frames(schedule: StreamSchedule) -> int | None:
        """Alone, at LLM speed, once sound plays: how many frames may wait before a render, so that decoding and
        rendering them takes at most 1/`opening_margin` of the sound ahead of the player. A frame costs a step and
        the last render's time a frame, its fixed part included: an over-estimate for longer renders, so chunks
        start small and grow with the sound ahead, whatever the vocoder costs (None: words render whole)."""
        ahead_s = schedule.ahead_s()
        if (not schedule.eager_opening or ahead_s is None or not schedule.rendered_frames
                or Pacer.paces(schedule.text_interval_ns())):
            return None
        # at least a microsecond: a clock coarser than a step and a render would measure both as nothing
        frame_cost_s = max(1e-6, schedule.step_s + schedule.render_s / schedule.rendered_frames)
        return max(1, int(ahead_s / (schedule.tuning.opening_margin * frame_cost_s)))

    # ---- among other streams ---------------------------------------------------------------------------
    @staticmethod
    def _shared_render_frames(schedule: StreamSchedule, unit: UtteranceSynthesizer) -> int | None:
        """Among other streams: how many of the pending frames to render (None: all). Whole multiples of
        `shared_render_quantum`, the rest waiting for the next render, so that the renders due together come in a
        few lengths and share their passes (`tts/codec/mel_codec.render_many`); all at a unit's end, before the
        first sound (the opening waits for nothing), and when less than a quantum is pending and the player has
        less than a quantum of sound ahead. A stream running dry renders whole quanta too: a pass's cost is mostly
        fixed (reading the weights), and at 16 sessions the 1- and 2-frame remainders took 45% of the render
        thread (docs/results.md), which made every stream run drier."""
        quantum = schedule.tuning.shared_render_quantum
        ahead_s = schedule.ahead_s()
        if schedule.eager_opening or unit.finished or quantum <= 1 or ahead_s is None:
            return None
        pending = schedule.pending(unit)
        if pending < quantum and ahead_s < quantum / schedule.frame_rate:
            return None
        return pending - pending % quantum

    @staticmethod
    def _opening_short(schedule: StreamSchedule, unit: UtteranceSynthesizer) -> bool:
        """Among other streams, before the first sound: would a render now still leave less than the first chunk's
        `shared_first_chunk_s`? Then the stream decodes on and one render voices its opening: rendered word by word,
        the stream waited for its first word's render (behind the render thread's pass) before its second word's
        steps, and the first sound for both (docs/results.md)."""
        if schedule.eager_opening or schedule.emitted_s or unit.finished:
            return False
        audio_s = schedule.unsent_s() + max(0, schedule.pending(unit) - schedule.held_back) / schedule.frame_rate
        return audio_s < schedule.tuning.shared_first_chunk_s

    @staticmethod
    def _renders_together(schedule: StreamSchedule, unit: UtteranceSynthesizer) -> bool:
        """Among other streams, with the player well supplied: let this word's frames wait for the next word's,
        so that one render (whose cost is mostly fixed) voices both."""
        if schedule.eager_opening or not schedule.emitted_s or unit.finished or schedule.first_sent_ns is None:
            return False
        tuning = schedule.tuning
        return schedule.ahead_s() > tuning.shared_ahead_s and schedule.unrendered_s(unit) < tuning.shared_render_s


POLICIES = {"s5": WordStreaming, "t5": FullContext, "sentence": Sentence}


def policy_for(mode: str) -> Policy:
    return POLICIES[mode]()
