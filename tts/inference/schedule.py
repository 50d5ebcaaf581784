"""The streaming engine's schedule: the mechanics of one stream, synchronous, no thread and no event loop of its own.

State in, decision out: the driver (`tts/inference/streaming.py`) puts words into the `Inbox` as they arrive and
calls `StreamSchedule.work()` on its worker thread. Each call takes the words that came in, lets the mode's policy
(`tts/inference/policies.py`: s5 word streaming, t5 full context, sentence) decide what the front synthesis unit
does next (decode a few frames, render, let a chunk go), and returns the chunk that may be played now, if any, with
"progress", "idle" (nothing to do until more text arrives), "wait" (among other streams, far enough ahead of its
player to let them go first) or "done". The schedule keeps what is decoded, rendered and sent, and the player's
clock as the stream sees it; the policy holds no state of the stream.

Threads. The event loop owns the driver and writes the `Inbox` (words, token stamps; `Inbox.ended` at the end of
the text and `Inbox.closed` on a cancel, each only ever set). The worker thread (a pool thread for one stream;
`StreamWorker`'s thread for many) owns this schedule and everything in it: nothing else touches it while a call
runs, and calls of one stream never overlap. `SharedCores.live_streams` is written by drivers under the worker's
lock and read here. Chunks cross back to the event loop as the call's result.

Synthesis units: a reply is spoken as a run of units, each a fresh `UtteranceSynthesizer` (its own decoder caches,
alignment and lookahead window) over one sentence, or a long clause of a long sentence (the inbox marks where each
ends: `stream_parts.UnitCutter`). Units share the codec stream, so the seam is the codec's own continuity.
Tests drive the schedule call by call with an injected clock (`tests/tts/inference/test_schedule.py`).
"""
from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np
import torch

from tts.codec.base import held_back_frames
from tts.inference.policies import Policy, policy_for
from tts.inference.stream_parts import (
    DEFAULT_MAX_STRETCH,
    AudioChunk,
    Inbox,
    LeadingSilence,
    Pacer,
    WordTime,
    WordTimeline,
)
from tts.inference.synthesis import (
    EncodeRequest,
    PendingRender,
    RenderRequest,
    Steps,
    SynthesisConfig,
    TTSBundle,
    UtteranceSynthesizer,
    VoicePrompt,
    run_steps,
)
from tts.inference.tuning import TUNING, StreamTuning


class SharedCores(Protocol):
    """What a schedule needs to know of a driver of many streams (`tts/inference/batching.StreamWorker`)."""
    live_streams: int


def default_emit_every(frame_rate: float) -> int:
    """Decoder steps per full-context chunk: the paper's 30 steps at 86 frames/s, as time (8 at 21.5 frames/s)."""
    return TUNING.emit_every(frame_rate)


class StreamSchedule:
    """The worker side of one utterance: its synthesis units, what of them is decoded, rendered and sent, pacing and
    the sound ahead of the player. `work()` runs one piece of work (a few decoder steps at most); nothing here
    blocks or waits. `shared`: the driver of many streams this one runs among (None: alone on the cores)."""

    def __init__(self, bundle: TTSBundle, mode: str, config: SynthesisConfig, emit_every: int, inbox: Inbox,
                 prompt: VoicePrompt | None = None, max_stretch: float = DEFAULT_MAX_STRETCH,
                 shared: SharedCores | None = None, tuning: StreamTuning = TUNING):
        self.bundle = bundle
        self.mode = mode
        self.policy: Policy = policy_for(mode)
        self.config = config
        self.emit_every = emit_every
        self.inbox = inbox
        self.times = inbox.times
        self.clock = inbox.clock
        self.prompt = prompt  # reference audio of the target voice, prefixed to every unit
        self.shared = shared
        self.tuning = tuning
        self.k = bundle.model.config.lookahead_words
        self.sample_rate = bundle.codec.sample_rate
        self.frame_rate = bundle.codec.frame_rate
        self.held_words: list[list[str]] = []  # full context: units whose words wait (sentence: its end, t5: the end)
        self._units: deque[UtteranceSynthesizer] = deque()  # synthesis units, run in order
        self._opened = 0  # units opened so far (each gets its own reproducible seed)
        self._cursor = 0  # frames of the front unit already rendered
        self._words_done: list[tuple[str, int]] = []  # (word, its end frame): completed, not yet in a chunk
        self.input_done = False  # the end of the text has been taken
        self._codec_stream = bundle.codec.streaming_decoder()
        self.held_back = held_back_frames(bundle.codec)  # codec frames a render keeps for its right context
        self.opening_first_render = self.held_back + tuning.opening_frames_past_holdback
        self._leading_silence = LeadingSilence(self.sample_rate)
        self.timeline = WordTimeline(self.sample_rate)  # each word's place in the audio
        self._untimed: list[tuple[str, tuple[int, int]]] = []  # completed words whose frames are not rendered yet
        self._announced_frame = -1  # the first frame of the last word a chunk announced
        stretchable = self._codec_stream.supports_stretch
        self.pacer = Pacer(max_stretch) if self.policy.paces and max_stretch > 1 and stretchable else None
        self._play_after_ns: int | None = None  # the pacer's prebuffer, until a chunk carries it
        self.hold_until_ns: int | None = None  # a short opening word waits for the next one until then
        self.resume_at_ns: int | None = None  # "wait": far enough ahead of the player to let other streams go first
        self.opening_ready = False  # the opening's sound is rendered and may leave once the next word's text is in
        # alone, a stream buys its first sound with frame-by-frame renders (`policies.WordStreaming`); among others
        # the cores are worth more than those 20-40 ms. Alone at its start and joined later: shared from then on
        self.eager_opening = shared is None or shared.live_streams <= 1
        self.emitted_s = 0.0  # audio sent so far
        self.first_sent_ns: int | None = None  # when the first sound was sent
        self._unsent: list[np.ndarray] = []  # rendered, not yet sent (the opening renders ahead of sending)
        self._unsent_codes: list[torch.Tensor] = []
        self._unsent_frames = 0
        self.step_s = 0.0  # the last decoder step's time
        self.render_s, self.rendered_frames = 0.0, 0  # the last render's time and frames
        self.completed_ahead = False  # a word completed while a render ran (`_decode_while_rendering`)
        self.traced_units: list[UtteranceSynthesizer] = []  # with `SynthesisConfig.trace_attention`: every unit

    # ---- lifetime ---------------------------------------------------------------------------------------
    def release(self) -> None:
        """Drop every model state (the driver calls it once no unit runs)."""
        self._units.clear()
        self.held_words.clear()
        self._codec_stream = None

    @property
    def released(self) -> bool:
        return self._codec_stream is None and not self._units

    @property
    def units(self) -> list[UtteranceSynthesizer]:
        """The synthesis units not yet fully sent, front first."""
        return list(self._units)

    # ---- one piece of work ------------------------------------------------------------------------------
    def work(self) -> tuple[AudioChunk | None, str]:
        """One piece of work: absorb input, decode a few frames of the front synthesis unit, render what may be
        emitted. Returns (chunk or None, "progress" | "idle" | "wait" | "done")."""
        return run_steps(self.work_steps())

    def work_steps(self) -> Steps[tuple[AudioChunk | None, str]]:
        """`work()` as a generator of its decoder steps (a driver of many streams batches them)."""
        if self.inbox.closed:
            return None, "done"
        if self.eager_opening and self.shared is not None and self.shared.live_streams > 1:
            # another stream joined: the frame-by-frame opening and chunks sized for a core of its own would run
            # dry on shared cores (4 server sessions: 26 one-frame gaps in one reply), so this stream shares too
            self.eager_opening = False
        started = self.clock()
        if self.policy.sound_first(self):
            return self.take_chunk(), "progress"  # the text the opening waited for came in: sound first
        words, ended = self.inbox.take()
        self.policy.take_words(self, words, ended and not self.input_done)
        self.input_done = ended
        taken = [unit for unit in self._units if unit.encoder.queued]
        if taken:
            yield EncodeRequest(taken)  # among other streams, encoded in one pass with theirs
        while self._units and self._units[0].finished and self._cursor >= len(self._units[0].frames):
            self._units.popleft()
            self._cursor = 0
        if not self._units:
            if self.input_done and not self.held_words:
                return (yield from self._emit_tail(started)), "done"
            return None, "idle"
        unit = self._units[0]
        if self.policy.release_hold(self, unit, started):
            chunk = self.emit(unit)  # the next word's text is in (or late): play what we have
            self.times.compute_ns += self.clock() - started
            return chunk, "progress"
        if not unit.ready():
            if ((not self.eager_opening and self.emitted_s) or unit.finished) and self.pending(unit):
                # frames held for a whole render quantum or for the next word (`policies.WordStreaming`) go now
                # that the text pauses: the player would otherwise run dry with them unheard, mid-word (a unit that
                # finished while its last render ran has its last frames here)
                yield from self.render_steps(unit)
                self.times.compute_ns += self.clock() - started
                return self.take_chunk(), "progress"
            return None, "idle"
        self.resume_at_ns = self._lead_cap_ns()
        if self.resume_at_ns is not None:
            return None, "wait"
        chunk = yield from self.policy.advance(self, unit)
        self.times.compute_ns += self.clock() - started
        return chunk, "progress"

    # ---- units ------------------------------------------------------------------------------------------
    def new_unit(self, words: list[str], complete: bool) -> UtteranceSynthesizer:
        """Open a synthesis unit over `words` (more may follow unless `complete`)."""
        config = self.config
        if config.seed is not None and self._opened:  # a different but reproducible seed per unit
            config = SynthesisConfig(**{**vars(self.config), "seed": self.config.seed + self._opened})
        self._opened += 1
        unit = UtteranceSynthesizer(self.bundle, config, self.prompt)
        if config.trace_attention:
            self.traced_units.append(unit)
        unit.push_words(words)
        if complete:
            unit.end()
        self._units.append(unit)
        return unit

    def open_unit(self) -> UtteranceSynthesizer:
        """The unit streamed words go to (a new one once the last has ended)."""
        if not self._units or self._units[-1].ended:
            return self.new_unit([], complete=False)
        return self._units[-1]

    @property
    def front(self) -> UtteranceSynthesizer | None:
        return self._units[0] if self._units else None

    @property
    def last_unit_ended(self) -> bool:
        return not self._units or self._units[-1].ended

    # ---- decoding and rendering ---------------------------------------------------------------------------
    def decode(self, unit: UtteranceSynthesizer, **steps) -> Steps[list]:
        """`unit.steps`, timing a decoder step (after this call's encoding of new words), counting what completed."""
        decoded, started = len(unit.frames), self.clock()
        work = unit.steps(**steps)
        completed = yield from (work if self.times.first_codec_frame_ns is not None else
                                self._stamp_first_frame(unit, work))
        if len(unit.frames) > decoded:
            self.step_s = (self.clock() - started) / 1e9 / (len(unit.frames) - decoded)
        self._count(unit, completed)
        return completed

    def _count(self, unit: UtteranceSynthesizer, completed: list) -> None:
        self.times.capped_words += sum(c.capped for c in completed)
        self.times.words += len(completed)
        spans = [self.timeline.word_done(c.word, c.codes.shape[1]) for c in completed]
        self._words_done += [(c.word, span[1]) for c, span in zip(completed, spans)]
        self._untimed += [(c.word, span) for c, span in zip(completed, spans)]

    def _stamp_first_frame(self, unit: UtteranceSynthesizer, steps: Steps[list]) -> Steps[list]:
        """`steps` passed through, stamping `first_codec_frame_ns` as the stream's first frame is decoded rather
        than when the call's steps end (up to `steps_per_work` frames later)."""
        try:
            request = next(steps)
            while True:
                output = yield request
                request = steps.send(output)
                if self.times.first_codec_frame_ns is None and unit.frames:
                    self.times.first_codec_frame_ns = self.clock()
        except StopIteration as stop:
            if self.times.first_codec_frame_ns is None and unit.frames:
                self.times.first_codec_frame_ns = self.clock()
            return stop.value
        finally:
            steps.close()

    def pending(self, unit: UtteranceSynthesizer) -> int:
        """Frames decoded and not yet rendered."""
        return len(unit.frames) - self._cursor

    def render(self, unit: UtteranceSynthesizer) -> None:
        """The frames decoded since the last render -> audio, kept until `take_chunk`."""
        run_steps(self.render_steps(unit))

    def render_steps(self, unit: UtteranceSynthesizer, frames: int | None = None, overlap: bool = False) -> Steps[None]:
        """`render` as a generator of its one render (a driver of many streams renders several in one pass);
        `frames`: only the first that many of the frames not yet rendered. `overlap`: where the driver renders on
        another thread, the unit decodes on meanwhile (`_decode_while_rendering`)."""
        new = unit.frames[self._cursor : None if frames is None else self._cursor + frames]
        if not new:
            return
        self._cursor += len(new)
        self.times.frames += len(new)
        codes = torch.stack(new, dim=1)
        started = self.clock()
        stretch = 1.0
        if self.pacer is not None:
            now, seconds = self.clock(), len(new) / self.frame_rate
            first = self.pacer.play_end_ns is None
            stretch = self.pacer.stretch(now, seconds, self._text_wait_ns(unit, now, self.text_interval_ns()))
            self.times.paced_s += seconds * (stretch - 1)
            if first and not self.inbox.ended:
                hold = Pacer.prebuffer_ns(self.inbox.word_interval_ns(), self.inbox.token_interval_ns())
                self._play_after_ns = now + hold if hold else None
                self.times.prebuffer_ms = hold / 1e6
        if self.times.first_render_asked_ns is None:
            self.times.first_render_asked_ns = started
        audio = yield RenderRequest(self._codec_stream, codes, stretch, overlap=overlap)
        if isinstance(audio, PendingRender):
            pending = audio
            yield from self._decode_while_rendering(unit, pending)
            audio = pending.audio if pending.done else (yield pending)
            if isinstance(audio, BaseException):
                raise audio
        if self.times.first_render_done_ns is None:
            self.times.first_render_done_ns = self.clock()
        self.render_s, self.rendered_frames = (self.clock() - started) / 1e9, len(new)
        samples_for = getattr(self._codec_stream, "samples_for", None)
        self.timeline.rendered(len(new), samples_for(len(new), stretch) if samples_for
                               else len(new) * self.bundle.codec.samples_per_frame)
        self._unsent.append(self._leading_silence(audio))
        self._unsent_codes.append(codes)
        self._unsent_frames += len(new)

    def _decode_while_rendering(self, unit: UtteranceSynthesizer, pending: PendingRender) -> Steps[None]:
        """On a worker with a render thread, while this stream's render runs there: its next frames, a step at a
        time (each in the worker's pass with the other streams' steps), until the render is back or
        `steps_per_work` frames wait; they go in a later render. Waiting idle instead, half the streams sat out
        each decoder pass at 12 sessions, and a pass's cost is mostly fixed (docs/results.md)."""
        for _ in range(self.tuning.steps_per_work):
            if pending.done or not unit.ready():
                return
            if (yield from self.decode(unit, max_frames=1)):
                self.completed_ahead = True

    def take_completed_ahead(self) -> bool:
        """Did a word complete while the last render ran (`_decode_while_rendering`)? Asked once: its frames are
        due for a render as a word completed in this call would be."""
        completed, self.completed_ahead = self.completed_ahead, False
        return completed

    def emit(self, unit: UtteranceSynthesizer) -> AudioChunk | None:
        self.render(unit)
        return self.take_chunk()

    def take_chunk(self) -> AudioChunk | None:
        """Everything rendered and not yet sent, as one chunk (None: nothing audible was rendered since)."""
        if self.hold_until_ns is not None:
            held_since = self.hold_until_ns - round(self.tuning.max_opening_hold_s * 1e9)
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
        self.emitted_s += len(audio) / self.sample_rate
        if self.first_sent_ns is None:
            self.first_sent_ns = self.clock()
        self.opening_ready = False
        words = self._take_rendered_words()
        return AudioChunk(audio, self.sample_rate, self.clock(), frames, codes=codes, play_after_ns=play_after,
                          words=words, word_times=self._timed_words())

    def _take_rendered_words(self) -> tuple[str, ...]:
        """The completed words whose frames are all rendered, taken for the chunk that carries them."""
        rendered = self.timeline.frames_rendered
        words = tuple(word for word, end in self._words_done if end <= rendered)
        self._words_done = [(word, end) for word, end in self._words_done if end > rendered]
        return words

    def _timed_words(self) -> tuple[WordTime, ...]:
        """Place the words rendered so far in the audio. Completed words whose frames are rendered go to
        `times.word_times` with their final span; the chunk announces, once each, every word whose start it is the
        first to carry, so that a client learns of a word no later than it receives the word's start: a word still
        being decoded is announced with the end of its sound so far."""
        timeline = self.timeline
        timeline.dropped = self._leading_silence.dropped
        announced = []
        while self._untimed and (time := timeline.time(*self._untimed[0])) is not None:
            start_frame = self._untimed.pop(0)[1][0]
            self.times.word_times.append(time)
            if start_frame > self._announced_frame:
                announced.append(time)
                self._announced_frame = start_frame
        front, start = self.front, timeline.frames_assigned  # the word being decoded starts after the completed
        if (front is not None and front.current_frames and not self._untimed and start > self._announced_frame
                and start < timeline.frames_rendered):
            end = min(timeline.frames_rendered, start + len(front.current_frames))
            announced.append(WordTime(front.words[front.current - 1], timeline.seconds(start), timeline.seconds(end)))
            self._announced_frame = start
        return tuple(announced)

    def _emit_tail(self, started: int) -> Steps[AudioChunk]:
        """The codec's last audio (a render: among other streams it runs beside their decoder steps) as the last chunk."""
        tail = np.zeros(0, np.float32)
        if self._codec_stream is not None:
            tail = self._leading_silence((yield RenderRequest(self._codec_stream, None, final=True)))
        self._unsent.append(tail)
        # nothing audible left (or in the whole utterance): the frames not yet sent still go out, with no sound
        chunk = self.take_chunk() or AudioChunk(
            tail, self.sample_rate, self.clock(), self._unsent_frames, words=self._take_rendered_words(),
            codes=torch.cat(self._unsent_codes, dim=1) if self._unsent_codes else None,
            word_times=self._timed_words())
        self.times.compute_ns += self.clock() - started
        return chunk

    # ---- the player, as this stream sees it ------------------------------------------------------------------
    def ahead_s(self) -> float | None:
        """Seconds of sound sent and not yet played, if the player started at the first chunk and never stalled."""
        if self.first_sent_ns is None:
            return None
        return (self.first_sent_ns - self.clock()) / 1e9 + self.emitted_s

    def unsent_s(self) -> float:
        """Seconds of audio rendered and not yet sent."""
        return sum(len(a) for a in self._unsent) / self.sample_rate

    def unrendered_s(self, unit: UtteranceSynthesizer) -> float:
        """Seconds of frames decoded and not yet sent (rendered or not)."""
        return (self.pending(unit) + self._unsent_frames) / self.frame_rate

    def urgency_s(self) -> float:
        """Among other streams, who goes first (least first): the seconds of sound ahead of the player; before
        the first sound, minus the seconds it has been allowed to start (an opening goes before every stream that
        plays, the longest waiting first)."""
        ahead_s = self.ahead_s()
        if ahead_s is not None:
            return ahead_s
        allowed_ns = self.times.start_allowed_ns
        return -1e6 if allowed_ns is None else -1e6 - (self.clock() - allowed_ns) / 1e9

    def _lead_cap_ns(self) -> int | None:
        """Among other streams: when this one, more than `shared_lead_s` ahead of its player, may go on (None: now)."""
        ahead_s, lead_s = self.ahead_s(), self.tuning.shared_lead_s
        if self.shared is None or self.shared.live_streams <= 1 or ahead_s is None or ahead_s <= lead_s:
            return None
        return self.clock() + round((ahead_s - lead_s) * 1e9)

    # ---- the text's pace ------------------------------------------------------------------------------------
    def next_word_free(self, unit: UtteranceSynthesizer) -> bool:
        """Has the text the unit's second word needs arrived (or ended)? Words waiting in the inbox count."""
        arrived, ended = self.inbox.waiting()
        return ended or unit.ended or len(unit.words) + arrived >= 2 + self.k

    def text_interval_ns(self) -> int | None:
        """The text's pace (`Pacer.pace_interval_ns`): the recent time between words, or `slow_word_tokens` times
        the recent time between tokens where that is longer (None before two words arrived)."""
        return Pacer.pace_interval_ns(self.inbox.word_interval_ns(), self.inbox.token_interval_ns())

    def _text_wait_ns(self, unit: UtteranceSynthesizer, now_ns: int, interval_ns: int | None) -> int | None:
        """s5: how long until the words the next word needs will have arrived, guessed from the recent word
        interval (None: the next word may be generated at once, or the text is too fast to pace)."""
        if self.inbox.ended or unit.ready() or not Pacer.paces(interval_ns):  # an LLM-speed stream keeps ahead
            return None
        missing = unit.current + self.k - len(unit.words) - self.inbox.waiting()[0]
        last = self.inbox.last_arrival_ns()
        return max(0, round(last + missing * interval_ns - now_ns)) if missing > 0 else None
