"""The driver of many streams: one worker thread runs the work of every live utterance, and their decoder steps as
one batched pass per model.

A decoder step of the CPU-sized model is dispatch-bound: its arithmetic is a fraction of the time its few dozen
small operations take to launch, so N utterances stepped one by one cost about N steps, and stepped together
(`tts/model/incremental.decode_steps`) little more than one (measured, one thread: 2.3 ms for one, 6.1 for eight).
A thread per stream also has the streams fight over two cores and one interpreter lock: with eight streams each
of their steps and renders took about four times as long as alone. So one thread does it all:

- a stream's driver (`tts/inference/streaming.py`) hands the worker its schedule (`submit`) where it would run one
  `work()` call on a thread of its own, and awaits the result;
- the worker runs each submitted call as the generator `StreamSchedule.work_steps()`: up to its next decoder step,
  then one `decode_steps` pass over the steps of every stream that has one pending, then each stream on with its
  row, up to its next step or the end of its call (which may render audio);
- renders go the same way (`StreamSchedule.render_steps` yields a `RenderRequest`). With `render_thread` they run
  on a second thread while the worker steps the other streams, and a stream that has sounded decodes its own next
  frames meanwhile (`RenderRequest.overlap`: it is sent a `PendingRender` at once, and yields it back when it must
  wait; waiting idle instead, half the streams sat out each decoder pass at 12 sessions, docs/results.md): the
  decoder steps are dispatch-bound Python and the renders convolutions that release the interpreter lock, so on
  two cores the two overlap where one thread did them in turn. Renders that come due while the render thread is
  busy wait and go together in its next pass. A burst of openings (many requests at once) renders half on the
  worker thread, which would otherwise wait for them. With `batch_renders` (the default) the renders of a pass run in few
  codec-decoder and vocoder calls, each for a group of like streams (`tts/codec/mel_codec.render_many`, the
  streams' last audio `flush_many`; among other streams renders are whole multiples of a few frames,
  `StreamTuning.shared_render_quantum`, so they come in few lengths), else each alone;
- the words streams took (`StreamSchedule.work_steps` yields an `EncodeRequest`) are encoded in one pass for all
  of them (`tts/model/incremental.encode_many`): a burst of new requests encodes their openings together;
- streams go in order of urgency (`StreamSchedule.urgency_s`: the least sound ahead of its player first, a stream
  that has none yet before all), so a new request's opening and a stream close to running dry are not kept
  waiting behind streams well ahead. Streams join and leave between steps (continuous batching); none waits for
  another's utterance, only for the steps of the pass its step is in.

Each stream keeps its own schedule, caches, masks, lookahead state and sampling generator; only the step's
arithmetic is shared, so every stream speaks the codes it speaks alone (tests). A stream cancelled while its call
runs finishes that call, as alone; a call that fails fails only its own stream, a failed batch every stream in it.
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from tts.codec.mel_codec import flush_many, render_many
from tts.inference.schedule import StreamSchedule
from tts.inference.synthesis import EncodeRequest, PendingRender, RenderRequest, StepRequest, encode_units
from tts.model.incremental import decode_step, decode_steps

# where a worker renders: on its own thread between decoder steps ("inline") or on a render thread ("thread"),
# each stream alone or the streams due together in one pass ("-batched")
RENDER_MODES = ("inline", "inline-batched", "thread", "thread-batched")
IDLE_EXIT_S = 5.0  # the worker thread ends after this long with nothing to do (the next submit starts another)
SHARED_OPENINGS = 4  # this many openings due together render half on the worker thread, half on the render thread
STOP_WAIT_S = 5.0  # how long a stopping server, or the interpreter's exit, waits for the calls in flight
# Workers whose thread runs. The thread is a daemon (an idle worker must not hold the process open), and a daemon
# thread still alive when the interpreter finalizes is killed where it stands, which aborted processes
# ("terminate called without an active exception"); so at exit every running worker is closed and waited for.
_RUNNING: "weakref.WeakSet[StreamWorker]" = weakref.WeakSet()


@dataclass(eq=False)  # compared and hashed by identity
class _Call:
    """One `work()` call of one stream, in flight on the worker."""
    schedule: StreamSchedule
    future: Future
    steps: object = None  # the running generator (`work_steps()`)
    request: StepRequest | RenderRequest | None = None  # the decoder step (or render) it waits for


@dataclass(eq=False)
class _RenderJob:
    """An overlapping render (`RenderRequest.overlap`) on the render thread while its call decodes on: the render
    thread reads `schedule` (urgency, whether it has sounded yet) and runs `request` (the call's request when it
    was handed over: the call has moved on since); the worker resolves `pending` with what comes back."""
    call: _Call
    request: RenderRequest
    pending: PendingRender = field(default_factory=PendingRender)

    @property
    def schedule(self) -> StreamSchedule:
        return self.call.schedule


@dataclass
class BatchStats:
    batches: int = 0
    steps: int = 0
    largest: int = 0
    sizes: dict[int, int] = field(default_factory=dict)  # batch size -> how many batches had it
    render_passes: int = 0  # passes that rendered more than one stream's frames
    renders: int = 0  # the renders those passes held
    encode_passes: int = 0  # encoder passes (each for the words every stream took since the last)
    encodes: int = 0  # the streams' encodes those passes held
    overlapped_renders: int = 0  # renders its stream decoded on beside (`RenderRequest.overlap`)
    render_s: float = 0.0  # time spent rendering (on the render thread where there is one): what a server's renders
    # cost, read beside the audio it served (`s5 bench serve`)
    step_s: float = 0.0  # time spent in decoder passes, read the same way


class StreamWorker:
    """Shared by every utterance of a server's voices (passed to each `StreamingSynthesizer`); thread-safe.

    Threads: `submit`, `join`, `leave` and `close` are called from the event loop; `live_streams`, the submitted
    calls and the finished renders are written under `_cond`; everything else (the running calls, their schedules
    while they run) belongs to the worker thread (`_run`), except a call whose render is on the render thread:
    that call, its schedule and its codec stream belong to the render thread until the render is handed back. An
    overlapping render (`_RenderJob`) takes only the codec stream: its call and schedule stay the worker's, which
    decodes on, and the render thread only reads the schedule's urgency and whether it has sounded."""

    def __init__(self, torch_threads: int = 2, batch_renders: bool = True, render_thread: bool | None = None):
        """`torch_threads`: the cores this worker may use. `render_thread` (default: with two or more) gives the
        renders a thread of their own with half of them, the decoder steps the rest. `batch_renders`: the renders
        due together run in one pass (measured side by side with each alone: docs/results.md)."""
        self.torch_threads, self.batch_renders = torch_threads, batch_renders
        self.render_thread = _renders_on_a_thread(torch_threads, render_thread)
        self.live_streams = 0  # streams between their start and their release (`join` / `leave`)
        self.stats = BatchStats()
        self._cond = threading.Condition()
        self._submitted: list[_Call] = []
        self._rendered: list[tuple[_Call | _RenderJob, object]] = []  # (call or job, audio or the exception) back
        # from the render thread
        self._in_render = 0  # calls handed to the render thread and not yet back
        self._to_render: list[_Call | _RenderJob] = []  # handed over, waiting for the render thread's next pass
        self._parked: dict[PendingRender, _Call] = {}  # the worker thread's: calls waiting for an overlapping render
        self._rendering = False  # the render thread has a pass running or due
        self._renderer: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._closing = False

    @classmethod
    def for_renders(cls, torch_threads: int, renders: str | None = None) -> "StreamWorker":
        """A worker whose renders go as `renders` says (`RENDER_MODES`; None: the default for `torch_threads`,
        batched, on a render thread with two threads or more)."""
        if renders is None:
            return cls(torch_threads)
        if renders not in RENDER_MODES:
            raise ValueError(f"renders {renders!r}: one of {', '.join(RENDER_MODES)}")
        return cls(torch_threads, batch_renders="batched" in renders, render_thread=renders.startswith("thread"))

    @property
    def renders(self) -> str:
        """How this worker renders (`RENDER_MODES`)."""
        where = "thread" if self.render_thread else "inline"
        return f"{where}-batched" if self.batch_renders else where

    @property
    def render_threads(self) -> int:
        """Torch threads the renders run on (what a voice is warmed up with: `TTSBundle.warm_up`)."""
        return render_threads_for(self.torch_threads, self.render_thread)

    @property
    def step_threads(self) -> int:
        """Torch threads the decoder steps run on."""
        return max(1, self.torch_threads - self.render_threads) if self.render_thread else self.torch_threads

    def join(self) -> None:
        """A stream starts (its driver calls `leave` when it is released)."""
        with self._cond:
            self.live_streams += 1

    def leave(self) -> None:
        with self._cond:
            self.live_streams -= 1

    def close(self, wait_s: float = 0.0) -> None:
        """Let the thread end once no call is in flight (a server shutting down; a later submit starts another),
        and wait up to `wait_s` for it: a daemon thread still inside a torch operation when the interpreter
        exits is killed there, and the C++ below it aborts the process ("terminate called without an active
        exception")."""
        with self._cond:
            self._closing = True
            self._cond.notify()
            thread, renderer = self._thread, self._renderer
        if wait_s > 0 and thread is not None:
            thread.join(wait_s)
        if wait_s > 0 and renderer is not None and not (thread and thread.is_alive()):
            renderer.shutdown(wait=True)

    def submit(self, schedule: StreamSchedule) -> Future:
        """Run one `schedule.work()` call on the worker: a future of its (chunk, state)."""
        call = _Call(schedule, Future())
        with self._cond:
            self._closing = False
            self._submitted.append(call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="s5-stream-worker", daemon=True)
                self._thread.start()
                _RUNNING.add(self)
            self._cond.notify()
        return call.future

    # ---- the worker thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(self.step_threads)
        running: list[_Call] = []  # calls waiting for a decoder step
        try:
            self._loop(running)
        except BaseException as error:  # a bug here must not leave streams waiting for ever
            with self._cond:
                stranded = running + self._submitted + list(self._parked.values()) + [
                    item.call if isinstance(item, _RenderJob) else item for item, _ in self._rendered]
                self._submitted, self._rendered, self._thread, self._parked = [], [], None, {}
            for call in stranded:
                if not call.future.done():
                    call.future.set_exception(error)
            raise

    def _loop(self, running: list[_Call]) -> None:
        with torch.inference_mode():
            while True:
                with self._cond:
                    if not (running or self._submitted or self._rendered or self._in_render):
                        if not self._closing:
                            self._cond.wait(IDLE_EXIT_S)
                        if not (self._submitted or self._rendered or self._in_render):
                            self._thread = None
                            if self._renderer is not None:  # idle: its thread ends too (the next render starts one)
                                self._renderer.shutdown(wait=False)
                                self._renderer = None
                            return
                    while not (running or self._submitted or self._rendered):  # only renders in flight
                        self._cond.wait()
                    new, self._submitted = self._submitted, []
                    rendered, self._rendered = self._rendered, []
                for call in _by_urgency(new):  # each up to its first decoder step (encoding the words it took)
                    self._advance(call, None, running)
                for item, audio in rendered:
                    if isinstance(item, _RenderJob):  # its call decoded on meanwhile; it may wait for this now
                        item.pending.audio, item.pending.done = audio, True
                        parked = self._parked.pop(item.pending, None)
                        if parked is not None:
                            self._advance(parked, audio, running)
                    else:
                        self._advance(item, audio, running)
                if running:
                    batch, running = running, []
                    encodes = [call for call in batch if isinstance(call.request, EncodeRequest)]
                    if encodes:  # the words streams took, in one encoder pass; each then on into this pass
                        batch = [call for call in batch if not isinstance(call.request, EncodeRequest)]
                        error = self._encode(encodes)
                        for call in _by_urgency(encodes):
                            self._advance(call, error, batch)
                    for call in [call for call in batch if isinstance(call.request, PendingRender)]:
                        batch.remove(call)
                        if call.request.done:
                            self._advance(call, call.request.audio, running)
                        else:
                            self._parked[call.request] = call
                    renders = [call for call in batch if isinstance(call.request, RenderRequest)]
                    if self.render_thread:
                        jobs = [_RenderJob(call, call.request) for call in renders if call.request.overlap]
                        here = self._openings_to_render_here(renders)
                        self._hand_over([call for call in renders if not call.request.overlap and call not in here] + jobs)
                        self.stats.overlapped_renders += len(jobs)
                        ahead: list[_Call] = []
                        for job in jobs:  # each decodes on while it renders, its first step in this pass
                            batch.remove(job.call)
                            self._advance(job.call, job.pending, ahead)
                        batch += [call for call in ahead if isinstance(call.request, StepRequest)]
                        running += [call for call in ahead if not isinstance(call.request, StepRequest)]
                        outputs = self._render(here) if here else {}
                    else:
                        outputs = self._render(renders)
                    outputs.update(self._step([call for call in batch if not isinstance(call.request, RenderRequest)]))
                    for call in _by_urgency(batch):
                        if call in outputs:
                            self._advance(call, outputs[call], running)

    def _advance(self, call: _Call, output, running: list[_Call]) -> None:
        """Run a call on to its next decoder step (kept in `running`) or its end (its future resolved); `output` an
        exception: its render failed."""
        if isinstance(output, BaseException):
            call.steps.close()
            call.future.set_exception(output)
            return
        try:
            if call.steps is None:
                call.steps = call.schedule.work_steps()
                call.request = next(call.steps)
            else:
                call.request = call.steps.send(output)
            running.append(call)
        except StopIteration as stop:
            call.future.set_result(stop.value)
        except BaseException as error:  # this stream's failure; the others go on
            call.future.set_exception(error)

    def _step(self, batch: list[_Call]) -> dict[_Call, object]:
        """Every pending decoder step, one pass per model (a guided state, with its two rows, runs alone)."""
        by_model: dict[int, list[_Call]] = {}
        for call in batch:
            if not call.request.state.guided:
                by_model.setdefault(id(call.request.state.model), []).append(call)
        outputs = {}
        started = time.perf_counter()
        try:
            for calls in by_model.values():
                rows = decode_steps([c.request.state for c in calls], [c.request.codes for c in calls],
                                    [c.request.words for c in calls])
                outputs.update(zip(calls, rows))
                self._count(len(calls))
            for call in batch:
                if call.request.state.guided:
                    outputs[call] = decode_step(call.request.state, call.request.codes, call.request.words)
        except BaseException as error:  # every stream in the batch sees the failure, as it would alone
            for call in batch:
                if call not in outputs:
                    call.steps.close()
                    call.future.set_exception(error)
        self.stats.step_s += time.perf_counter() - started
        return outputs

    def _encode(self, calls: list[_Call]) -> BaseException | None:
        """Every call's taken words in one encoder pass per model (`tts/inference/synthesis.encode_units`); a
        failure fails every call of the pass, as a failed decoder batch does."""
        try:
            encode_units([unit for call in calls for unit in call.request.units])
        except BaseException as error:
            return error
        self.stats.encode_passes += 1
        self.stats.encodes += len(calls)
        return None

    @staticmethod
    def _openings_to_render_here(renders: list[_Call]) -> list[_Call]:
        """A burst of openings (`SHARED_OPENINGS` or more streams' first sound due in one pass, as when many
        requests come at once): the least urgent half renders on this thread beside the render thread, so that
        the burst's first sounds take both cores, not one while this thread waits (docs/results.md)."""
        openings = [call for call in renders if call.schedule.first_sent_ns is None and not call.request.overlap]
        if len(openings) < SHARED_OPENINGS:
            return []
        return _by_urgency(openings)[len(openings) - len(openings) // 2:]

    def _hand_over(self, calls: list[_Call]) -> None:
        """The render thread renders these calls' frames (`_render`) and hands each back through `_rendered`.
        Renders handed over while it is busy wait and go together in its next pass: every stream whose render came
        due meanwhile, one pass (batched with `batch_renders`)."""
        if not calls:
            return
        if self._renderer is None:
            self._renderer = ThreadPoolExecutor(1, "s5-render", initializer=torch.set_num_threads,
                                                initargs=(self.render_threads,))
        with self._cond:
            self._in_render += len(calls)
            self._to_render += calls
            if self._rendering:
                return
            self._rendering = True
        self._renderer.submit(self._render_on_thread)

    def _render_on_thread(self) -> None:
        while True:
            with self._cond:
                calls, self._to_render = self._to_render, []
                if not calls:
                    self._rendering = False
                    return
            # a stream with no sound yet renders its opening first, in a pass of its own, and is handed back before
            # the rest: a larger pass takes longer, and a first sound is the one thing nobody hears yet
            openings = [call for call in calls if call.schedule.first_sent_ns is None]
            for group in (openings, [call for call in calls if call.schedule.first_sent_ns is not None]):
                if not group:
                    continue
                with torch.inference_mode():
                    outputs = self._render(_by_urgency(group))
                with self._cond:
                    self._rendered += [(call, outputs[call]) for call in group]
                    self._in_render -= len(group)
                    self._cond.notify()

    def _render(self, calls: list[_Call]) -> dict[_Call, object]:
        """Every pending render: in one pass per group of like streams, or each alone. A failure is the output of
        every call of the pass not yet rendered (`_advance` fails those calls, on the worker thread)."""
        outputs = {}
        if not calls:
            return outputs
        started = time.perf_counter()
        pushes = [call for call in calls if not call.request.final]
        ends = [call for call in calls if call.request.final]  # streams' last audio (`stream.flush()`)
        try:
            if self.batch_renders and len(pushes) > 1:
                audio = render_many([c.request.stream for c in pushes], [c.request.codes for c in pushes],
                                    [c.request.stretch for c in pushes])
                outputs.update(zip(pushes, audio))
                self.stats.render_passes += 1
                self.stats.renders += len(pushes)
            if self.batch_renders and len(ends) > 1:
                outputs.update(zip(ends, flush_many([c.request.stream for c in ends])))
            for call in calls:
                if call not in outputs:
                    outputs[call] = call.request.run()
        except BaseException as error:  # as a failed decoder batch: every stream in it sees the failure
            for call in calls:
                outputs.setdefault(call, error)
        self.stats.render_s += time.perf_counter() - started
        return outputs

    def _count(self, size: int) -> None:
        stats = self.stats
        stats.batches += 1
        stats.steps += size
        stats.largest = max(stats.largest, size)
        stats.sizes[size] = stats.sizes.get(size, 0) + 1


@atexit.register
def _close_running_workers() -> None:
    for worker in list(_RUNNING):
        worker.close(wait_s=STOP_WAIT_S)


def _renders_on_a_thread(torch_threads: int, render_thread: bool | None) -> bool:
    """Whether a worker renders on a thread of its own: as asked, else wherever it has two threads or more."""
    return torch_threads >= 2 if render_thread is None else render_thread


def render_threads_for(torch_threads: int, render_thread: bool | None = None) -> int:
    """The torch threads a `StreamWorker(torch_threads, render_thread=...)` renders on: half of them on a render
    thread of its own, else all of them on the worker."""
    return max(1, torch_threads // 2) if _renders_on_a_thread(torch_threads, render_thread) else torch_threads


def _by_urgency(calls: list[_Call]) -> list[_Call]:
    return sorted(calls, key=lambda call: call.schedule.urgency_s())
