"""The streaming engine's schedule: one per utterance, synchronous, no thread and no event loop of its own.

State in, unit out: the driver (`tts/inference/streaming.py`) puts words into the `Inbox` as they arrive and calls
`StreamSchedule.work()` on its worker thread. Each call decides, for the mode, what the model does next
(encode the words that came in, decode a few frames of the front synthesis unit, voice what may leave), does it,
and returns the chunk that may be played now, if any, with "progress", "idle" (nothing to do until more text
arrives) or "done". Tests drive it directly, without threads (`tests/tts/inference/test_schedule.py`).

Synthesis units: a reply is spoken as a run of units, each a fresh `UtteranceSynthesizer` (its own decoder caches,
alignment and lookahead window) over one sentence, or a long clause of a long sentence (`ends_unit`). The model
was trained on single sentences; one decoder context over a 170-word reply lost its alignment after about 15 s
and babbled. A unit ends at its last word without waiting for lookahead past it, and the next starts as soon as
its own k + 1 words are in; units share the codec stream, so the seam is the codec's own continuity (no click) and
the pause between is the one the model speaks at a sentence's end and start. Every mode cuts the same units: `t5`
waits for the whole reply, then speaks it unit by unit with full context per unit.

Modes (`s5` word by word, `t5` full context, `sentence`), pacing for slow text and the opening, where the first
sound's floor is, are described in `docs/streaming_engine.md`; the constants below are their knobs.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import torch

from tts.codec.base import held_back_frames
from tts.codec.vocoder_choice import OpeningRule
from tts.inference.stream_parts import (
    DEFAULT_MAX_STRETCH,
    SEGMENT_BREAK,
    AudioChunk,
    Inbox,
    LeadingSilence,
    Pacer,
    ends_unit,
    split_units,
)
from tts.inference.synthesis import (
    Steps,
    SynthesisConfig,
    TTSBundle,
    UtteranceSynthesizer,
    VoicePrompt,
    run_steps,
)

PAPER_EMIT_SECONDS = 30 / 86.13  # T5 emission in the paper: every 30 decoder steps at 86.13 frames/s
S5_STEPS_PER_WORK = 8  # s5: decoder steps per `work()` call (a new word or a cancel waits at most one call)
SHORT_OPENING_S = 0.35  # s5: an opening word shorter than this is held while the next word waits for its text...
MAX_OPENING_HOLD_S = 0.4  # ...for at most this long, so that "Your | balance is $738.67" plays without a gap
OPENING_FRAMES_PAST_HOLDBACK = OpeningRule.frames_past_holdback  # s5: the opening word's frames leave from this
# many decoder steps past what the codec holds back, then after every step (why: `tts/codec/vocoder_choice.py`,
# whose estimate of the first sound follows these two)
SHARED_FIRST_CHUNK_S = 0.3  # s5 among other streams (no eager opening): the first sound waits until this much is
# rendered, so that it lasts while the next words are decoded on shared cores
SHARED_AHEAD_S = 1.0  # s5 among other streams: while this much sound is ahead of the player, completed words wait
SHARED_RENDER_S = 1.0  # to be rendered together, up to this much a render (a render costs ~5 ms + ~0.4 ms a frame)
SHARED_LEAD_S = 2.0  # among other streams: a stream this far ahead of its player waits ("wait") until it is not,
# so that the cores go to the streams nearer to running dry (a new request's opening first) instead of racing ahead
OPENING_MARGIN = OpeningRule.margin  # s5 alone: the first chunk carries at least this many times the time its
# successor takes to make, and every later chunk is rendered before decoding and rendering it would take more than
# 1/this of the sound ahead


def default_emit_every(frame_rate: float) -> int:
    """Decoder steps per T5 chunk: the paper's 30 steps at 86 frames/s, as time (8 steps at 21.5 frames/s)."""
    return max(1, round(PAPER_EMIT_SECONDS * frame_rate))


class StreamSchedule:
    """The worker side of one utterance: its synthesis units, what of them is decoded, rendered and sent, pacing and
    the opening. `work()` runs one piece of work (a few decoder steps at most); nothing here blocks or waits."""

    def __init__(self, bundle: TTSBundle, mode: str, config: SynthesisConfig, emit_every: int, inbox: Inbox,
                 prompt: VoicePrompt | None = None, max_stretch: float = DEFAULT_MAX_STRETCH):
        self.bundle = bundle
        self.mode = mode
        self.config = config
        self.emit_every = emit_every
        self.inbox = inbox
        self.times = inbox.times
        self.clock = inbox.clock
        self.prompt = prompt  # reference audio of the target voice, prefixed to every unit
        self.k = bundle.model.config.lookahead_words
        self.sample_rate = bundle.codec.sample_rate
        # full-context modes: words wait here for the end of their unit (sentence) or of the text (t5)
        self._held_words: list[str] = []
        self._units: deque[UtteranceSynthesizer] = deque()  # synthesis units, run in order
        self._opened = 0  # units opened so far (each gets its own reproducible seed)
        self._unit_words = 0  # s5: words given to the unit still open
        self._cursor = 0  # frames of the front unit already rendered
        self._words_done: list[str] = []  # completed since the last chunk
        self.input_done = False  # the end of the text has been taken
        self._codec_stream = bundle.codec.streaming_decoder()
        self.opening_first_render = held_back_frames(bundle.codec) + OPENING_FRAMES_PAST_HOLDBACK  # decoder steps
        self._leading_silence = LeadingSilence(self.sample_rate)
        stretchable = self._codec_stream.supports_stretch
        self._pacer = Pacer(max_stretch) if mode == "s5" and max_stretch > 1 and stretchable else None
        self._play_after_ns: int | None = None  # the pacer's prebuffer, until a chunk carries it
        self.hold_until_ns: int | None = None  # a short opening word waits for the next one until then
        self.resume_at_ns: int | None = None  # "wait": far enough ahead of the player to let other streams go first
        self.opening_ready = False  # the opening's sound is rendered and may leave once the next word's text is in
        # the opening's frame-by-frame renders and the small chunks after it buy the first sound ~20-40 ms at about
        # 20 % more CPU a stream (a render costs ~5 ms whatever its length): worth it alone, not when other
        # streams share the cores (8 streams, batched: 0.161 -> 0.128 CPU-s per audio second). Alone it pays with
        # HiFi-GAN V1 too, whose renders cost several times more: `OPENING_MARGIN` sizes the first chunk by what the
        # next one costs to make (8 replayed turns, AMD EPYC: first sound 103-107 ms after word 3 p50, 0 underruns;
        # without the eager opening 230 ms)
        worker = bundle.stream_worker
        self.eager_opening = worker is None or worker.live_streams <= 1
        self._emitted_s = 0.0  # audio sent so far
        self._first_sent_ns: int | None = None  # when the first sound was sent
        self._unsent: list[np.ndarray] = []  # rendered, not yet sent (the opening renders ahead of sending)
        self._unsent_codes: list[torch.Tensor] = []
        self._unsent_frames = 0
        self._step_s = 0.0  # the last decoder step's time
        self._render_s, self._rendered_frames = 0.0, 0  # the last render's time and frames
        self.traced_units: list[UtteranceSynthesizer] = []  # with `SynthesisConfig.trace_attention`: every unit

    def release(self) -> None:
        """Drop every model state (the driver calls it once no unit runs)."""
        self._units.clear()
        self._held_words.clear()
        self._codec_stream = None

    @property
    def released(self) -> bool:
        return self._codec_stream is None and not self._units

    @property
    def units(self) -> list[UtteranceSynthesizer]:
        """The synthesis units not yet fully sent, front first."""
        return list(self._units)

    def _new_unit(self, words: list[str]) -> None:
        config = self.config
        if config.seed is not None and self._opened:  # a different but reproducible seed per unit
            config = SynthesisConfig(**{**vars(self.config), "seed": self.config.seed + self._opened})
        self._opened += 1
        unit = UtteranceSynthesizer(self.bundle, config, self.prompt)
        if config.trace_attention:
            self.traced_units.append(unit)
        unit.push_words(words)
        if self.mode != "s5":
            unit.end()
        self._units.append(unit)

    def _absorb_input(self) -> None:
        words, ended = self.inbox.take()
        if self.mode == "s5":
            run: list[str] = []
            for word in words + [SEGMENT_BREAK] * (ended and not self.input_done):  # the end: a last break
                if word != SEGMENT_BREAK:
                    run.append(word)
                    self._unit_words += 1
                    if not ends_unit(self._unit_words, word):
                        continue
                elif not run and (not self._units or self._units[-1].ended):
                    continue  # a break with no unit open: nothing to end
                unit = self._open_unit()
                unit.push_words(run)  # arrived together: one encoder pass
                run = []
                if unit.words or ended or word != SEGMENT_BREAK:
                    unit.end()  # the unit is complete: its last words need no lookahead past it
                self._unit_words = 0
            if run:
                self._open_unit().push_words(run)
        else:
            for word in words:
                if word == SEGMENT_BREAK:
                    self._flush_held()
                    continue
                self._held_words.append(word)
                if self.mode == "sentence" and ends_unit(len(self._held_words), word):
                    self._flush_held()
            if ended and not self.input_done:
                self._flush_held()
        self.input_done = ended

    def _open_unit(self) -> UtteranceSynthesizer:
        """s5: the unit words go to (a new one after a break)."""
        if not self._units or self._units[-1].ended:
            self._new_unit([])
        return self._units[-1]

    def _flush_held(self) -> None:
        for unit in split_units(self._held_words):
            self._new_unit(unit)
        self._held_words = []

    def work(self) -> tuple[AudioChunk | None, str]:
        """One piece of work: absorb input, decode a few frames of the front synthesis unit, render what may be
        emitted. Returns (chunk or None, "progress" | "idle" | "wait" | "done")."""
        return run_steps(self.work_steps())

    def work_steps(self) -> Steps[tuple[AudioChunk | None, str]]:
        """`work()` as a generator of its decoder steps (a driver of many streams batches them)."""
        if self.inbox.closed:
            return None, "done"
        started = self.clock()
        if self.opening_ready and self._units and self._next_word_free(self._units[0]):
            return self._take_chunk(), "progress"  # the text it waited for came in: sound first, encoding after
        self._absorb_input()
        while self._units and self._units[0].finished and self._cursor >= len(self._units[0].frames):
            self._finish_unit()
        if not self._units:
            if self.input_done and not self._held_words:
                return self._emit_tail(started), "done"
            return None, "idle"
        unit = self._units[0]
        if self.hold_until_ns is not None and (started >= self.hold_until_ns or unit.ready()):
            chunk = self._emit(unit)  # the next word's text is in (or late): play what we have
            self.times.compute_ns += self.clock() - started
            return chunk, "progress"
        if not unit.ready():
            return None, "idle"
        self.resume_at_ns = self._lead_cap_ns()
        if self.resume_at_ns is not None:
            return None, "wait"
        if self.mode == "s5" and self._in_opening():
            return (yield from self._opening_work(unit, started)), "progress"
        if self.mode == "s5":
            budget = self._affordable_frames()
            steps = S5_STEPS_PER_WORK if budget is None else max(1, min(S5_STEPS_PER_WORK, budget - self._pending(unit)))
            completed = yield from self._decode(unit, max_frames=steps, stop_at_word=True)
            emit = bool(completed) or unit.finished or (budget is not None and self._pending(unit) >= budget)
            if emit and self._renders_together(unit):
                emit = False
        else:
            completed = yield from unit.steps(max_frames=self.emit_every - (len(unit.frames) - self._cursor))
            emit = len(unit.frames) - self._cursor >= self.emit_every or unit.finished
        self._count(unit, completed)
        chunk = None
        if emit:
            self._render(unit)
            holding = (self.mode == "s5" and not self.eager_opening and not self._emitted_s and not unit.finished
                       and self._unsent_s() < SHARED_FIRST_CHUNK_S)
            chunk = None if holding else self._take_chunk()
        self.times.compute_ns += self.clock() - started
        return chunk, "progress"

    def _count(self, unit: UtteranceSynthesizer, completed: list) -> None:
        self.times.capped_words += sum(c.capped for c in completed)
        self.times.words += len(completed)
        self._words_done += [c.word for c in completed]
        if self.times.first_codec_frame_ns is None and unit.frames:
            self.times.first_codec_frame_ns = self.clock()

    def _in_opening(self) -> bool:
        """s5, LLM-speed text, no sound has left yet: the opening word is rendered as it is decoded, and its sound
        leaves as soon as nothing can make it wait (slow text: the pacer decides how the opening plays)."""
        return self.eager_opening and not self._emitted_s and not Pacer.paces(self._text_interval_ns())

    def _opening_work(self, unit: UtteranceSynthesizer, started: int) -> Steps[AudioChunk | None]:
        """Decode a step (the first call: the steps before the first sound can be rendered), render at once, and
        let the sound go when the word after the opening one may follow at once (its text is in, or the text
        ended) or the opening word is long (`SHORT_OPENING_S`); a short opening word whose successor waits for
        text is held until that text is in, at most `MAX_OPENING_HOLD_S`. Once the sound is ready, the calls
        that wait for that text decode a step each without rendering, so that `work` lets it go within a step of
        the text's arrival."""
        completed = yield from self._decode(unit, max_frames=max(1, self.opening_first_render - len(unit.frames)),
                                            stop_at_word=True)
        self._count(unit, completed)
        if not self.opening_ready:
            self._render(unit)
            # the first chunk must last while the next is made (a step and a render, at this moment's speed: an LLM
            # on the same cores can make both several times slower)
            next_work_s = self._step_s + self._render_s
            sound_s = self._unsent_s()
            self.opening_ready = sound_s > 0 and (sound_s >= OPENING_MARGIN * next_work_s or unit.finished)
        emit = self.opening_ready and (unit.finished or self._next_word_free(unit)
                                        or self._unrendered_s(unit) >= SHORT_OPENING_S)
        if self.opening_ready and unit.current > 1 and not emit and self.hold_until_ns is None:
            self.hold_until_ns = self.clock() + round(MAX_OPENING_HOLD_S * 1e9)
        # what is rendered leaves now; frames decoded since wait for the next call's render (a finished unit
        # has no next call)
        chunk = (self._emit(unit) if unit.finished else self._take_chunk()) if emit else None
        self.times.compute_ns += self.clock() - started
        return chunk

    def _decode(self, unit: UtteranceSynthesizer, **steps) -> Steps[list]:
        """`unit.steps`, timing a decoder step (after this call's encoding of new words)."""
        decoded, started = len(unit.frames), self.clock()
        completed = yield from unit.steps(**steps)
        if len(unit.frames) > decoded:
            self._step_s = (self.clock() - started) / 1e9 / (len(unit.frames) - decoded)
        return completed

    def _pending(self, unit: UtteranceSynthesizer) -> int:
        """Frames decoded and not yet rendered."""
        return len(unit.frames) - self._cursor

    def _affordable_frames(self) -> int | None:
        """Alone, at LLM speed, once sound plays: how many frames may wait before a render, so that decoding and
        rendering them takes at most 1/`OPENING_MARGIN` of the sound ahead of the player. A frame costs a step and
        the last render's time a frame, its fixed part included: an over-estimate for longer renders, so chunks
        start small and grow with the sound ahead, whatever the vocoder costs (None: words render whole)."""
        ahead_s = self._ahead_s()
        if not self.eager_opening or ahead_s is None or not self._rendered_frames or Pacer.paces(
                self._text_interval_ns()):
            return None
        # at least a microsecond: a clock coarser than a step and a render would measure both as nothing
        frame_cost_s = max(1e-6, self._step_s + self._render_s / self._rendered_frames)
        return max(1, int(ahead_s / (OPENING_MARGIN * frame_cost_s)))

    def _next_word_free(self, unit: UtteranceSynthesizer) -> bool:
        """Has the text the second word needs arrived (or ended)? Words that came in while the unit ran count, not
        encoded here (that would delay this chunk)."""
        arrived, ended = self.inbox.waiting()
        return ended or unit.ended or len(unit.words) + arrived >= 2 + self.k

    def _renders_together(self, unit: UtteranceSynthesizer) -> bool:
        """Among other streams, with the player well supplied: let this word's frames wait for the next word's,
        so that one render (whose cost is mostly fixed) voices both."""
        if self.eager_opening or not self._emitted_s or unit.finished or self._first_sent_ns is None:
            return False
        return self._ahead_s() > SHARED_AHEAD_S and self._unrendered_s(unit) < SHARED_RENDER_S

    def _ahead_s(self) -> float | None:
        """Seconds of sound sent and not yet played, if the player started at the first chunk and never stalled."""
        if self._first_sent_ns is None:
            return None
        return (self._first_sent_ns - self.clock()) / 1e9 + self._emitted_s

    def urgency_s(self) -> float:
        """Among other streams, who goes first (least first): the seconds of sound ahead of the player; before
        the first sound, minus the seconds it has been allowed to start (an opening goes before every stream that
        plays, the longest waiting first)."""
        ahead_s = self._ahead_s()
        if ahead_s is not None:
            return ahead_s
        allowed_ns = self.times.start_allowed_ns
        return -1e6 if allowed_ns is None else -1e6 - (self.clock() - allowed_ns) / 1e9

    def _lead_cap_ns(self) -> int | None:
        """Among other streams: when this one, more than `SHARED_LEAD_S` ahead of its player, may go on (None: now)."""
        worker = self.bundle.stream_worker
        ahead_s = self._ahead_s()
        if worker is None or worker.live_streams <= 1 or ahead_s is None or ahead_s <= SHARED_LEAD_S:
            return None
        return self.clock() + round((ahead_s - SHARED_LEAD_S) * 1e9)

    def _unsent_s(self) -> float:
        """Seconds of audio rendered and not yet sent."""
        return sum(len(a) for a in self._unsent) / self.sample_rate

    def _unrendered_s(self, unit: UtteranceSynthesizer) -> float:
        """Seconds of frames decoded and not yet sent (rendered into `_unsent` or not)."""
        return (self._pending(unit) + self._unsent_frames) / self.bundle.codec.frame_rate

    def _emit(self, unit: UtteranceSynthesizer) -> AudioChunk | None:
        self._render(unit)
        return self._take_chunk()

    def _render(self, unit: UtteranceSynthesizer) -> None:
        """The frames decoded since the last render -> audio, kept in `_unsent` until `_take_chunk`."""
        new = unit.frames[self._cursor :]
        if not new:
            return
        self._cursor = len(unit.frames)
        self.times.frames += len(new)
        codes = torch.stack(new, dim=1)
        started = self.clock()
        if self._pacer is None:
            audio = self._codec_stream.push(codes)
        else:
            now, seconds = self.clock(), len(new) / self.bundle.codec.frame_rate
            first = self._pacer.play_end_ns is None
            interval = self._text_interval_ns()
            stretch = self._pacer.stretch(now, seconds, self._text_wait_ns(unit, now, interval))
            audio = self._codec_stream.push(codes, stretch)
            self.times.paced_s += seconds * (stretch - 1)
            if first and not self.inbox.ended:
                hold = Pacer.prebuffer_ns(self._word_interval_ns(), self._token_interval_ns())
                self._play_after_ns = now + hold if hold else None
                self.times.prebuffer_ms = hold / 1e6
        self._render_s, self._rendered_frames = (self.clock() - started) / 1e9, len(new)
        self._unsent.append(self._leading_silence(audio))
        self._unsent_codes.append(codes)
        self._unsent_frames += len(new)

    def _take_chunk(self) -> AudioChunk | None:
        """Everything rendered and not yet sent, as one chunk (None: nothing audible was rendered since)."""
        if self.hold_until_ns is not None:
            held_since = self.hold_until_ns - round(MAX_OPENING_HOLD_S * 1e9)
            self.times.opening_hold_ms = (self.clock() - held_since) / 1e6
            self.hold_until_ns = None
        if not any(len(a) for a in self._unsent):  # nothing audible yet: the frames go with the first sound
            return None
        audio = np.concatenate(self._unsent) if len(self._unsent) > 1 else self._unsent[0]
        codes = torch.cat(self._unsent_codes, dim=1) if self._unsent_codes else None
        frames = self._unsent_frames
        self._unsent, self._unsent_codes, self._unsent_frames = [], [], 0
        play_after = None
        if self._play_after_ns is not None:  # on the first chunk (every chunk has samples)
            play_after, self._play_after_ns = self._play_after_ns, None
        self._emitted_s += len(audio) / self.sample_rate
        if self._first_sent_ns is None:
            self._first_sent_ns = self.clock()
        self.opening_ready = False
        words, self._words_done = tuple(self._words_done), []
        return AudioChunk(audio, self.sample_rate, self.clock(), frames, codes=codes, play_after_ns=play_after,
                          words=words)

    def _text_wait_ns(self, unit: UtteranceSynthesizer, now_ns: int, interval_ns: int | None) -> int | None:
        """s5: how long until the words the next word needs will have arrived, guessed from the recent word
        interval (None: the next word may be generated at once, or the text is too fast to pace)."""
        if self.inbox.ended or unit.ready() or not Pacer.paces(interval_ns):  # an LLM-speed stream keeps ahead
            return None
        missing = unit.current + self.k - len(unit.words) - self.inbox.waiting()[0]
        last = self.inbox.last_arrival_ns()
        return max(0, round(last + missing * interval_ns - now_ns)) if missing > 0 else None

    def _text_interval_ns(self) -> int | None:
        """The text's pace (`Pacer.pace_interval_ns`): the recent time between words, or `SLOW_WORD_TOKENS` times
        the recent time between tokens where that is longer (None before two words arrived)."""
        return Pacer.pace_interval_ns(self._word_interval_ns(), self._token_interval_ns())

    def _word_interval_ns(self) -> int | None:
        return self.inbox.word_interval_ns()

    def _token_interval_ns(self) -> int | None:
        return self.inbox.token_interval_ns()

    def _finish_unit(self) -> None:
        self._units.popleft()
        self._cursor = 0

    def _emit_tail(self, started: int) -> AudioChunk:
        tail = self._leading_silence(self._codec_stream.flush()) if self._codec_stream is not None else np.zeros(0, np.float32)
        self._unsent.append(tail)
        # nothing audible left (or in the whole utterance): the frames not yet sent still go out, with no sound
        chunk = self._take_chunk() or AudioChunk(
            tail, self.sample_rate, self.clock(), self._unsent_frames, words=tuple(self._words_done),
            codes=torch.cat(self._unsent_codes, dim=1) if self._unsent_codes else None)
        self.times.compute_ns += self.clock() - started
        return chunk
