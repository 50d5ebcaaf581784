"""The batched driver for many streams: the decoder steps of every live utterance of one voice run as one pass.

A decoder step of the CPU-sized model is dispatch-bound: its arithmetic is a fraction of the time its few dozen
small operations take to launch, so N utterances stepped one by one cost about N steps, and stepped together
(`tts/model/incremental.decode_steps`) little more than one. Each stream keeps its own schedule, worker thread,
caches, masks, lookahead state and sampling generator; only the step itself is shared:

- `UtteranceSynthesizer` asks `DecodeBatcher.step` for its next decoder step instead of running it, inside
  `decoding()` while its decode loop runs (a stream between two of its steps will ask again at once);
- the first thread to ask while no batch runs leads: it waits until every stream that is decoding has asked (or
  `max_wait_s`, so a stream busy elsewhere cannot stall the others), runs the batch, hands each stream its row,
  and the next asker leads the next batch. Streams join and leave between steps (continuous batching); none waits
  for another's utterance, only for the batch its step is in.

A stream cancelled mid-batch finishes the step it is in (its row is computed with the others) and then stops, as
alone. Batched rows equal the streams' own steps up to float rounding (tests: the same codes).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch

from tts.model.incremental import DecoderState, StepOutput, decode_steps


@dataclass
class _Request:
    state: DecoderState
    codes: torch.Tensor  # (K, 1)
    words: torch.Tensor  # (1,)
    output: StepOutput | None = None
    error: BaseException | None = None


@dataclass
class BatchStats:
    batches: int = 0
    steps: int = 0
    largest: int = 0
    sizes: dict[int, int] = field(default_factory=dict)  # batch size -> how many batches had it


class DecodeBatcher:
    """Shared by every utterance of one voice (`TTSBundle.decode_batcher`); thread-safe."""

    def __init__(self, max_wait_s: float = 0.002):
        self.max_wait_s = max_wait_s
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._leading = False
        self._decoding = 0  # streams inside a decode loop: each will ask for a step soon
        self.live_streams = 0  # streams between their start and their release (`joined`)
        self.stats = BatchStats()

    def join(self) -> None:
        """A stream starts (its driver calls `leave` when it is released)."""
        with self._cond:
            self.live_streams += 1

    def leave(self) -> None:
        with self._cond:
            self.live_streams -= 1

    @contextmanager
    def decoding(self) -> Iterator[None]:
        """Around a stream's decode loop: while inside, a leader waits for its next step."""
        with self._cond:
            self._decoding += 1
        try:
            yield
        finally:
            with self._cond:
                self._decoding -= 1
                self._cond.notify_all()

    def step(self, state: DecoderState, codes: torch.Tensor, words: torch.Tensor) -> StepOutput:
        """One decoder step of `state` (as `decode_step(state, codes, words)`), run in a batch with the others'."""
        request = _Request(state, codes, words)
        with self._cond:
            self._pending.append(request)
            self._cond.notify_all()
            while request.output is None and request.error is None:
                if self._leading:
                    self._cond.wait()
                    continue
                self._leading = True
                deadline = time.monotonic() + self.max_wait_s
                while len(self._pending) < self._decoding and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                batch, self._pending = self._pending, []
                self._cond.release()
                try:
                    self._run(batch)
                finally:
                    self._cond.acquire()
                    self._leading = False
                    self._cond.notify_all()
        if request.error is not None:
            raise request.error
        return request.output

    def _run(self, batch: list[_Request]) -> None:
        try:
            outputs = decode_steps([r.state for r in batch], [r.codes for r in batch], [r.words for r in batch])
        except BaseException as error:  # every stream in the batch sees the failure, as it would alone
            for r in batch:
                r.error = error
            return
        for r, output in zip(batch, outputs):
            r.output = output
        stats = self.stats
        stats.batches += 1
        stats.steps += len(batch)
        stats.largest = max(stats.largest, len(batch))
        stats.sizes[len(batch)] = stats.sizes.get(len(batch), 0) + 1
