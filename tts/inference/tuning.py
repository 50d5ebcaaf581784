"""The streaming engine's tuning, in one place: every number the engine decides by, a line each saying why that value.

`TUNING` is what the engine runs with; tests and experiments pass another `StreamTuning` (frozen: nothing changes
one while a stream runs). The figures behind each value are in `docs/results.md` and `docs/streaming_engine.md`.
"""
from __future__ import annotations

from dataclasses import dataclass

from tts.codec.vocoder_choice import OpeningRule


@dataclass(frozen=True)
class StreamTuning:
    # -- synthesis units: a reply is spoken as units the model was trained on (sentences of up to 30 words)
    clause_unit_words: int = 16  # a sentence this long is cut at its next clause end (comma, semicolon, colon, dash)
    max_unit_words: int = 30  # and at this many words whatever the word: the longest training sentences have 30

    # -- s5 alone (one stream on the cores): the opening, then chunks sized by the sound ahead
    steps_per_work: int = 8  # decoder steps per work() call at most: a new word or a cancel waits one call at most
    opening_frames_past_holdback: int = OpeningRule.frames_past_holdback  # the first render's steps past what the
    # codec holds back (the first frame is mostly the voice's leading silence); `auto`'s estimate uses the same
    opening_margin: float = OpeningRule.margin  # the first chunk lasts this many times the next piece of work, and
    # later chunks leave before decoding and rendering them would take more than 1/this of the sound ahead
    opening_min_sound_s: float = OpeningRule.min_sound_s  # and the first chunk lasts at least this long: a step on
    # a shared VM can take four times the last one
    short_opening_s: float = 0.35  # an opening word shorter than this waits for the next word's text...
    max_opening_hold_s: float = 0.4  # ...for at most this long: "Your | balance is $738.67" plays without a gap

    # -- s5 among other streams (a server's worker): fewer, larger renders; the most urgent stream first
    shared_first_chunk_s: float = 0.5  # the first sound waits until this much is rendered, so it lasts while the
    # next words are decoded on shared cores (0.3 s: at 16 sessions a quarter of the second chunks came late)
    shared_ahead_s: float = 0.6  # while this much sound is ahead of the player, completed words wait to be
    shared_render_s: float = 1.0  # rendered together, up to this much a render (its cost is mostly fixed)
    shared_render_quantum: int = 4  # renders are whole multiples of this many frames (the rest waits for the next
    # render; a unit's last frames go as they are), so the renders due together share their passes (4 frames:
    # 40-47 ms of one thread per second of audio for 4-8 streams against 113 rendered alone, docs/results.md)
    shared_lead_s: float = 1.0  # a stream this far ahead of its player waits, so the cores go to streams nearer
    # to running dry (a new request's opening first): fewer rows in each decoder pass make the passes of those
    # that need them quicker; kept above `shared_ahead_s`, so that words still render together (docs/results.md)

    # -- full context (t5, sentence): the paper's fair streaming
    paper_emit_s: float = 30 / 86.13  # a chunk every 30 decoder steps at 86.13 frames/s (S5's mean frames a word
    # in the paper), as time, so the comparison holds at our frame rate

    # -- pacing (s5): slow text is spoken slower rather than with gaps
    max_stretch: float = 1.3  # slowest pacing: 3.6 words/s (this voice) down to 2.8, still a normal speaking rate
    slow_text_s: float = 0.2  # seconds per word: only text slower than this (5 words/s) is paced
    slow_word_tokens: float = 4.5  # a slow LLM's text is paced as if every word took this many tokens: one word of
    # many tokens (a price, a time, markup) then finds speech buffered (3-4 gaps a reply at 10-15 tokens/s without)
    prebuffer_words: float = 3.0  # the player holds paced speech this many words' text time (a run of short words)
    prebuffer_tokens: int = 8  # or this many of a slow LLM's tokens ("$738.67," is seven)
    max_prebuffer_s: float = 1.0  # and never longer than this
    pacing_margin_s: float = 0.35  # reserve kept ahead when stretching: the next word's compute, jitter

    # -- sound
    fade_in_s: float = 0.001  # the first sound after the dropped leading silence fades in over this: no click

    def emit_every(self, frame_rate: float) -> int:
        """Decoder steps per full-context chunk at a codec's frame rate (8 at 21.5 frames/s)."""
        return max(1, round(self.paper_emit_s * frame_rate))


TUNING = StreamTuning()
