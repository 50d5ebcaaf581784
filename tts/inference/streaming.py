"""The streaming engine's driver: words in one at a time from the event loop, audio chunks out as soon as the model
may speak. One `StreamingSynthesizer` per utterance (nothing survives a request).

Call `push_word` / `push_break` / `end` from the event loop and iterate `chunks()` for `AudioChunk`s. What the model
does and when audio may leave is the schedule's (`tts/inference/schedule.py`: modes, synthesis units, pacing, the
opening); this driver only feeds it the words and runs its units one at a time on a worker thread, so the event
loop stays free and cancellation takes effect within one unit. Given a `StreamWorker` (a server of many streams:
`tts/inference/batching.py`) the units run there, among every other stream's, steps batched.

Threads: the event loop owns the synthesizer (push_word, end, chunks, aclose); a unit runs on a worker thread
(a pool thread, or the `StreamWorker`'s) and owns the schedule while it runs; they meet at the `Inbox` (words in)
and the unit's future (a chunk out). See `tts/inference/schedule.py`.
"""
from __future__ import annotations

import asyncio
import gc
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

import torch

from audio_io.errors import UserError
from tts.inference.schedule import StreamSchedule, default_emit_every
from tts.inference.stream_parts import (  # noqa: F401  (re-exported: the engine's public names)
    DEFAULT_MAX_STRETCH,
    MODES,
    SEGMENT_BREAK,
    AudioChunk,
    Inbox,
    LeadingSilence,
    Pacer,
    UtteranceTimes,
)
from tts.inference.synthesis import SynthesisConfig, TTSBundle, VoicePrompt
from tts.paths import ASSETS

if TYPE_CHECKING:  # annotations only: batching imports the schedule this module drives
    from tts.inference.batching import StreamWorker

MODELS_DIR = ASSETS / "models"
WORKER_TORCH_THREADS = 1  # measured (2 cores): a decoder step 9.2 -> 6.5 ms, a 3-frame render 24 -> 19 ms in a
# worker thread; two intra-op threads beside the main thread's (loading the voice ran with two) run slower than one
# (libgomp stops spin-waiting: docs/streaming_engine.md), and one leaves a core to an LLM on the same machine


def check_max_stretch(value: float | None, name: str = "--max-stretch") -> float:
    """The pacing limit from a flag or the config (None: the default), checked."""
    value = DEFAULT_MAX_STRETCH if value is None else float(value)
    if not 1.0 <= value <= 2.0:
        raise UserError(f"{name} must be between 1 (pacing off) and 2, not {value}")
    return value


def default_model_dir(mode: str) -> Path:
    """The shipped checkpoint a mode runs by default: S5 (k=2) for s5, the full-context teacher otherwise.
    S5_MODELS_DIR points elsewhere (a folder holding s5_default/ and t5_default/)."""
    root = Path(os.environ.get("S5_MODELS_DIR") or MODELS_DIR)
    return root / ("s5_default" if mode == "s5" else "t5_default")


def load_bundle(mode: str, model_dir: Path | str | None = None, codec_dir: Path | str | None = None,
                vocoder: str | None = None, render_threads: int = WORKER_TORCH_THREADS) -> TTSBundle:
    """The voice a mode runs, warmed up for renders on `render_threads` torch threads. `vocoder` (else the codec's
    own, "auto" for the shipped one): "auto" chooses by timing this machine against this model's decoder step
    (`tts/codec/vocoder_choice.py`), "universal" (HiFi-GAN V1), "fast" (iSTFT) or a folder."""
    from tts.codec.mel_codec import MelCodec
    from tts.codec.vocoder_choice import AUTO

    directory = Path(model_dir) if model_dir else default_model_dir(mode)
    if not (directory / "model.safetensors").exists():
        raise UserError(f"no S5-TTS checkpoint in {directory} (train one with `s5 train`)")
    bundle = TTSBundle.load(directory, codec_dir)
    if isinstance(bundle.codec, MelCodec):
        name = vocoder or bundle.codec.config.vocoder
        bundle.codec.use_vocoder(name, bundle.time_decoder_step() if name == AUTO else None)
    elif vocoder:
        raise UserError("--vocoder goes with the mel codec (this voice uses another codec)")
    bundle.warm_up(render_threads)
    # what loading made lives as long as the process: out of the collector's sight. With the S5 voice loaded a full
    # collection took 176 ms (185k objects), under 0.1 ms frozen: a pause that would stall a turn's worker
    gc.freeze()
    return bundle


class StreamingSynthesizer:
    """One utterance, driven from the event loop. `worker`: the driver of many streams to run on (None: a worker
    thread of the event loop's pool runs each unit)."""

    def __init__(self, bundle: TTSBundle, mode: str = "s5", config: SynthesisConfig | None = None, emit_every: int | None = None,
                 prompt: VoicePrompt | None = None, max_stretch: float = DEFAULT_MAX_STRETCH,
                 worker: "StreamWorker | None" = None):
        if mode not in MODES:
            raise UserError(f"unknown mode {mode!r} (choose from {', '.join(MODES)})")
        k = bundle.model.config.lookahead_words
        if mode == "s5" and k is None:
            raise UserError("s5 mode needs an S5 checkpoint (lookahead_words set); this one is full-context")
        self.bundle = bundle
        self.mode = mode
        self.config = config or SynthesisConfig()
        self.emit_every = emit_every or default_emit_every(bundle.codec.frame_rate)
        self.k = k
        self.sample_rate = bundle.codec.sample_rate
        self.times = UtteranceTimes()
        self.inbox = Inbox(self.times)
        self._worker = worker  # many streams share one worker: counted while this one lives
        if worker is not None:
            worker.join()
        self.schedule = StreamSchedule(bundle, mode, self.config, self.emit_every, self.inbox, prompt, max_stretch,
                                       shared=worker)
        self._wake = asyncio.Event()
        self._unit: asyncio.Future | None = None  # the worker unit in flight

    # ---- input (event loop thread) ----------------------------------------------------------------------
    def note_token(self, t_ns: int) -> None:
        """An LLM token arrived (spoken or not): its rate paces the speech when it is slow."""
        self.inbox.put_token(t_ns)

    def push_word(self, word: str) -> None:
        if self.inbox.ended:
            raise RuntimeError("push_word after end()")
        now, unit_ended = self.inbox.put_word(word)
        if self.times.start_allowed_ns is None and (
            (self.mode == "s5" and (len(self.times.word_arrivals_ns) == self.k + 1 or unit_ended))
            or (self.mode == "sentence" and unit_ended)
        ):
            self.times.start_allowed_ns = now
        self._wake.set()

    def push_break(self) -> None:
        """The text pauses here (a code block the voice skips): the words so far are spoken with no lookahead
        past them, as a whole; the words after start a new unit (s5, sentence). Full context (t5) ignores it."""
        if self.inbox.ended:
            raise RuntimeError("push_break after end()")
        if self.mode == "t5":
            return
        self.inbox.put_word(SEGMENT_BREAK)
        if self.times.start_allowed_ns is None and self.times.word_arrivals_ns:
            self.times.start_allowed_ns = time.perf_counter_ns()
        self._wake.set()

    def end(self) -> None:
        if self.inbox.ended:
            return
        self.inbox.end()
        self.times.end_ns = time.perf_counter_ns()
        if self.times.start_allowed_ns is None:
            self.times.start_allowed_ns = self.times.end_ns
        self._wake.set()

    async def aclose(self) -> None:
        """Cancel: stop decoding, drop every model state and queued word (a running unit finishes first)."""
        self.inbox.closed = True
        self._wake.set()
        if self._unit is not None and not self._unit.done():
            try:
                await self._unit
            except Exception:  # the unit's own failure changes nothing now
                pass
        self._release()

    def _release(self) -> None:
        self.inbox.clear()
        self.schedule.release()
        if self._worker is not None:
            self._worker.leave()
            self._worker = None

    @property
    def busy(self) -> bool:
        return self._unit is not None and not self._unit.done()

    @property
    def released(self) -> bool:
        return self.schedule.released and not self.busy

    # ---- output (event loop thread) ---------------------------------------------------------------------
    async def chunks(self) -> AsyncIterator[AudioChunk]:
        try:
            while not self.inbox.closed:
                self._wake.clear()
                # shielded: a cancelled consumer leaves the unit to finish in its thread; aclose() waits for it
                if self._worker is not None:
                    self._unit = asyncio.wrap_future(self._worker.submit(self.schedule))
                else:
                    self._unit = asyncio.ensure_future(asyncio.to_thread(self._run_unit))
                chunk, state = await asyncio.shield(self._unit)
                if chunk is not None and len(chunk.samples):
                    self.times.sent(chunk)
                    yield chunk
                if state == "done":
                    return
                if state == "idle":
                    await self._wait_for_input(self.schedule.hold_until_ns)
                elif state == "wait":
                    await self._wait_for_input(self.schedule.resume_at_ns)
        finally:
            if (self.inbox.closed or self.schedule.input_done) and not self.busy:  # else aclose() releases after the unit
                self._release()

    def _run_unit(self) -> tuple[AudioChunk | None, str]:
        torch.set_num_threads(WORKER_TORCH_THREADS)
        return self.schedule.work()

    async def _wait_for_input(self, until_ns: int | None) -> None:
        """Until a word arrives (or the end, or a cancel), or `until_ns`: when a held opening word is released, or
        a stream ahead of its player may go on."""
        if until_ns is None:
            await self._wake.wait()
            return
        timeout = max(0.0, (until_ns - time.perf_counter_ns()) / 1e9)
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            pass
