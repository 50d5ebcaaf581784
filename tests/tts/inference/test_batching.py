"""Many streams on one worker, their decoder steps batched: each stream speaks exactly what it speaks alone."""
import asyncio

import pytest
import torch

from tts.inference.batching import StreamWorker
from tts.inference.pipeline import speak
from tts.inference.streaming import StreamingSynthesizer
from tts.inference.synthesis import SynthesisConfig, UtteranceSynthesizer
from tts.model.incremental import decode_step, decode_steps

TEXTS = ["Hello there, my friend. How are you doing today?",
         "The weather is fine, and the train leaves at noon.",
         "Sure! Let me check that for you right away."]


def config(seed: int) -> SynthesisConfig:
    return SynthesisConfig(seed=seed, max_frames_per_word=5)


def codes_of(chunks) -> torch.Tensor:
    return torch.cat([c.codes for c in chunks if c.codes is not None], dim=1)


def test_a_batched_step_is_each_utterances_own_step(tiny_bundle):
    """Utterances at different positions with different memory: one decode_steps pass gives every row what
    decode_step gives it alone (logits, hidden state, attention over its own tokens), and advances each state."""
    bundle = tiny_bundle(2)
    alone, together = [], []
    for text, frames in zip(TEXTS, (3, 7, 1)):
        for group in (alone, together):
            synth = UtteranceSynthesizer(bundle, config(0))
            synth.push_words(text.split())
            synth.step(max_frames=frames)
            group.append(synth)
    codes = [s.last_frame for s in alone]
    words = [torch.tensor([s.current]) for s in alone]
    expected = [decode_step(s.decoder, c, w) for s, c, w in zip(alone, codes, words)]
    got = decode_steps([s.decoder for s in together], codes, words)
    for e, g, a, t in zip(expected, got, alone, together):
        assert torch.allclose(e.logits, g.logits, atol=1e-5) and torch.allclose(e.hidden, g.hidden, atol=1e-5)
        assert torch.allclose(e.token_attention, g.token_attention, atol=1e-6)
        assert a.decoder.position == t.decoder.position


def speak_alone(bundle) -> list[torch.Tensor]:
    return [codes_of(asyncio.run(speak(bundle, t.split(), "s5", config=config(i), max_stretch=1.0)).chunks)
            for i, t in enumerate(TEXTS)]


async def _speak_together(bundle, worker, starts_s: list[float], cancel_after: int | None = None):
    """Each text in its own stream, joining at its start time, all on `worker`."""
    async def one(i: int):
        await asyncio.sleep(starts_s[i])
        if cancel_after is not None and i == 1:
            synth = StreamingSynthesizer(bundle, "s5", config(i), max_stretch=1.0)
            for word in TEXTS[i].split():
                synth.push_word(word)
            synth.end()
            chunks = []
            async for chunk in synth.chunks():
                chunks.append(chunk)
                if len(chunks) == cancel_after:
                    break
            await synth.aclose()
            return chunks
        return (await speak(bundle, TEXTS[i].split(), "s5", config=config(i), max_stretch=1.0,
                            worker=worker)).chunks

    return await asyncio.gather(*(one(i) for i in range(len(TEXTS))))


def test_streams_batched_speak_what_they_speak_alone(tiny_bundle):
    alone = speak_alone(tiny_bundle(2))
    bundle = tiny_bundle(2)
    worker = StreamWorker()
    together = asyncio.run(_speak_together(bundle, worker, [0.0, 0.01, 0.05]))  # joining at different times
    for a, t in zip(alone, together):
        assert torch.equal(a, codes_of(t))
    stats = worker.stats
    assert stats.largest == 3 and stats.steps > stats.batches  # steps really ran together
    assert stats.overlapped_renders > 0  # and streams decoded on while their renders ran
    assert worker.live_streams == 0  # every stream left when it was released


def test_streams_that_start_together_encode_their_words_together(tiny_bundle, monkeypatch):
    """Three requests at once: their first words go through the encoder in one pass (its query projection runs
    once for all of them), and each stream still speaks what it speaks alone."""
    alone = speak_alone(tiny_bundle(2))
    bundle = tiny_bundle(2)
    passes = []
    bundle.model.encoder_layers[0].attn.query.register_forward_hook(lambda *_: passes.append(1))
    worker = StreamWorker()
    together = asyncio.run(_speak_together(bundle, worker, [0.0, 0.0, 0.0]))
    for a, t in zip(alone, together):
        assert torch.equal(a, codes_of(t))
    stats = worker.stats
    assert stats.encodes >= 3 and stats.encode_passes == len(passes) < stats.encodes


def test_an_encoder_pass_that_fails_fails_the_streams_in_it_and_the_worker_serves_on(tiny_bundle, monkeypatch):
    """The batched encoder pass raises: every stream whose words were in it gets the error (as a failed decoder
    batch does: their encoders may be half updated), none hangs, and the next request speaks as alone."""
    import tts.inference.batching as batching

    alone = speak_alone(tiny_bundle(2))
    bundle = tiny_bundle(2)
    worker = StreamWorker()
    encode_units = batching.encode_units

    def failing(units):
        raise RuntimeError("encoder failed")

    monkeypatch.setattr(batching, "encode_units", failing)

    async def together():
        return await asyncio.gather(*(speak(bundle, t.split(), "s5", config=config(i), max_stretch=1.0, worker=worker)
                                      for i, t in enumerate(TEXTS)), return_exceptions=True)

    results = asyncio.run(together())
    assert all(isinstance(r, RuntimeError) and str(r) == "encoder failed" for r in results)
    monkeypatch.setattr(batching, "encode_units", encode_units)
    assert torch.equal(alone[1], codes_of(asyncio.run(speak(bundle, TEXTS[1].split(), "s5", config=config(1),
                                                            max_stretch=1.0, worker=worker)).chunks))
    assert worker.live_streams == 0


def test_a_stream_alone_opens_eagerly_and_one_among_others_saves_the_renders(tiny_bundle):
    """The opening's frame-by-frame renders buy latency with CPU: a stream takes them only when no other stream
    of the worker is live."""
    bundle = tiny_bundle(2)
    worker = StreamWorker()
    first = StreamingSynthesizer(bundle, "s5", config(0), worker=worker)
    second = StreamingSynthesizer(bundle, "s5", config(1), worker=worker)
    assert first.schedule.eager_opening and not second.schedule.eager_opening
    asyncio.run(first.aclose())
    asyncio.run(second.aclose())
    assert worker.live_streams == 0
    assert StreamingSynthesizer(bundle, "s5", config(2), worker=worker).schedule.eager_opening


def test_a_stream_cancelled_mid_batch_leaves_the_others_intact(tiny_bundle):
    alone = speak_alone(tiny_bundle(2))
    bundle = tiny_bundle(2)
    worker = StreamWorker()
    together = asyncio.run(_speak_together(bundle, worker, [0.0, 0.0, 0.0], cancel_after=2))
    assert torch.equal(alone[0], codes_of(together[0])) and torch.equal(alone[2], codes_of(together[2]))
    cancelled = codes_of(together[1])
    assert cancelled.shape[1] < alone[1].shape[1] and torch.equal(cancelled, alone[1][:, : cancelled.shape[1]])
    assert worker.live_streams == 0 and not worker._submitted  # nothing left waiting


def test_a_stream_whose_work_fails_fails_alone(tiny_bundle, monkeypatch):
    """One stream's render raises on the worker: that stream gets the error, the others speak what they speak
    alone, and the worker goes on serving."""
    from tts.inference.schedule import StreamSchedule

    alone = speak_alone(tiny_bundle(2))
    bundle = tiny_bundle(2)
    worker = StreamWorker()
    render, render_steps = StreamSchedule.render, StreamSchedule.render_steps

    def failing_render(self, unit):
        if self.config.seed == 1:
            raise RuntimeError("render failed")
        render(self, unit)

    def failing_render_steps(self, unit, frames=None, overlap=False):
        if self.config.seed == 1:
            raise RuntimeError("render failed")
        return (yield from render_steps(self, unit, frames, overlap))

    monkeypatch.setattr(StreamSchedule, "render", failing_render)
    monkeypatch.setattr(StreamSchedule, "render_steps", failing_render_steps)

    async def together():
        return await asyncio.gather(*(speak(bundle, t.split(), "s5", config=config(i), max_stretch=1.0, worker=worker)
                                      for i, t in enumerate(TEXTS)), return_exceptions=True)

    results = asyncio.run(together())
    assert isinstance(results[1], RuntimeError)
    assert torch.equal(alone[0], codes_of(results[0].chunks)) and torch.equal(alone[2], codes_of(results[2].chunks))
    monkeypatch.setattr(StreamSchedule, "render", render)
    monkeypatch.setattr(StreamSchedule, "render_steps", render_steps)
    assert torch.equal(alone[1], codes_of(asyncio.run(speak(bundle, TEXTS[1].split(), "s5", config=config(1),
                                                            max_stretch=1.0, worker=worker)).chunks))


def test_renders_of_many_streams_in_one_pass_are_each_streams_own_audio(tiny_bundle):
    """`render_many`: streams of one codec pushed together (stacked states; one stretched, one push of a length
    that runs alone, one stream younger than the others) get the audio their own pushes make."""
    import numpy as np

    from tts.codec.mel_codec import render_many

    codec = tiny_bundle(2).codec
    torch.manual_seed(0)
    codes = [torch.randint(0, codec.codebook_size, (codec.num_codebooks, 15)) for _ in range(3)]
    pushes = [(0, 4), (4, 8), (8, 11), (11, 15)]  # 4, 4, 3 (split into 2 + 1, alone), 4 frames
    stretches = [1.0, 1.25, 1.0]
    alone, together = ([codec.streaming_decoder() for _ in codes] for _ in range(2))
    heard_alone, heard_together = [[] for _ in codes], [[] for _ in codes]
    for n, (a, b) in enumerate(pushes):
        live = [i for i in range(3) if not (i == 2 and n == 0)]  # the third joins one push late
        for i in live:
            heard_alone[i].append(alone[i].push(codes[i][:, a:b], stretches[i]))
        for i, audio in zip(live, render_many([together[i] for i in live], [codes[i][:, a:b] for i in live],
                                              [stretches[i] for i in live])):
            heard_together[i].append(audio)
    for i in range(3):
        one, many = np.concatenate(heard_alone[i]), np.concatenate(heard_together[i])
        assert one.shape == many.shape and len(one) > 0
        np.testing.assert_allclose(many, one, atol=2e-4 * max(1e-3, float(np.abs(one).max())) + 1e-6)


@pytest.mark.parametrize("lengths, passes", [((12, 8, 4), {"decoder": 2, "vocoder": 2}),
                                              ((12, 12, 12, 12), {"decoder": 2, "vocoder": 1})])
@pytest.mark.parametrize("started", ["together", "apart"])
def test_renders_of_several_streams_take_few_passes(tiny_bundle, monkeypatch, lengths, passes, started):
    """`render_many` plans few passes. Pushes of 12 (8 + 4), 8 and 4 frames run as rounds of one piece length (the
    8-frame pieces of the first two, then the 4-frame pieces of the first and the third): two passes of the codec
    decoder and two of the vocoder, not three. Four pushes of 12 frames run as one push length: the codec decoder
    twice (its pieces), the vocoder once for all four, as a stream's own push runs it. Each stream hears what its
    own pushes make. Streams whose first push ran alone (a server renders each opening in a pass of its own) stack
    all the same."""
    import numpy as np

    from tts.codec.mel_codec import render_many

    codec = tiny_bundle(2).codec
    torch.manual_seed(1)
    codes = [torch.randint(0, codec.codebook_size, (codec.num_codebooks, 4 + n)) for n in lengths]
    alone, together = ([codec.streaming_decoder() for _ in codes] for _ in range(2))
    heard_alone = [np.concatenate([s.push(c[:, :4]), s.push(c[:, 4:])]) for s, c in zip(alone, codes)]
    if started == "together":
        first = render_many(together, [c[:, :4] for c in codes], [1.0] * len(codes))
    else:
        first = [s.push(c[:, :4]) for s, c in zip(together, codes)]
    counted = counted_passes(codec, monkeypatch)
    second = render_many(together, [c[:, 4:] for c in codes], [1.0] * len(codes))
    assert counted == passes
    for one, a, b in zip(heard_alone, first, second):
        many = np.concatenate([a, b])
        assert one.shape == many.shape and len(one) > 0
        np.testing.assert_allclose(many, one, atol=2e-4 * max(1e-3, float(np.abs(one).max())) + 1e-6)


def test_flushes_of_many_streams_in_one_pass_are_each_streams_own_end(tiny_bundle, monkeypatch):
    """`flush_many`: streams that end together flush in one codec-decoder pass and one vocoder pass for their frames
    (plus its end), each getting its own flush's audio. Their states stack though each stream pushed alone (each
    built its own state keys); a stream whose state holds other shapes (it pushed nothing) flushes alone."""
    import numpy as np

    from tts.codec.mel_codec import flush_many

    codec = tiny_bundle(2).codec
    torch.manual_seed(2)
    codes = [torch.randint(0, codec.codebook_size, (codec.num_codebooks, n)) for n in (8, 5, 12)]
    alone, together = ([codec.streaming_decoder() for _ in range(4)] for _ in range(2))
    for streams in (alone, together):
        for stream, c in zip(streams, codes):
            stream.push(c)
    ends_alone = [stream.flush() for stream in alone]
    counted = counted_passes(codec, monkeypatch)
    ends_together = flush_many(together)
    assert counted == {"decoder": 1 + 1, "vocoder": 2 + 2}  # the three stacked, then the fourth alone
    for one, many in zip(ends_alone, ends_together):
        assert one.shape == many.shape
        np.testing.assert_allclose(many, one, atol=2e-4 * max(1e-3, float(np.abs(one).max(initial=0))) + 1e-6)
    assert len(ends_alone[0]) > 0


def counted_passes(codec, monkeypatch) -> dict[str, int]:
    """From now on, how many times the codec's decoder and its vocoder run (a dict that counts)."""
    passes = {"decoder": 0, "vocoder": 0}

    def counting(name, forward):
        def run(*args, **kwargs):
            passes[name] += 1
            return forward(*args, **kwargs)
        return run

    monkeypatch.setattr(codec.model.decoder, "forward", counting("decoder", codec.model.decoder.forward))
    monkeypatch.setattr(codec.vocoder.generator, "forward", counting("vocoder", codec.vocoder.generator.forward))
    return passes


def test_renders_due_while_the_render_thread_is_busy_go_together_and_sound_as_alone(tiny_bundle, monkeypatch):
    """Through the worker: the render thread's first pass is held until the other streams' renders have come due
    behind it; they then run in one batched pass, and each stream's codes are its own and its audio that of its
    codes (the streams alone on the render thread's own pushes)."""
    import threading
    import time

    import numpy as np

    bundle = tiny_bundle(2)
    worker = StreamWorker(2, batch_renders=True, render_thread=True)
    render, held, passes = StreamWorker._render, threading.Event(), []

    def holding_render(self, calls):
        if not held.is_set():
            deadline = time.monotonic() + 30
            while len(calls) < 2 and len(self._to_render) < 2 and time.monotonic() < deadline:  # others queue
                time.sleep(0.001)
            held.set()
        passes.append(len(calls))
        return render(self, calls)

    monkeypatch.setattr(StreamWorker, "_render", holding_render)
    together = asyncio.run(_speak_together(bundle, worker, [0.0, 0.0, 0.0]))
    alone = speak_alone(tiny_bundle(2))
    for a, t in zip(alone, together):
        assert torch.equal(a, codes_of(t))
        audio = np.concatenate([c.samples for c in t])
        assert len(audio) > 0 and np.isfinite(audio).all()
    assert max(passes) >= 2  # the renders that came due behind the held one: one pass
    assert worker.stats.render_passes > 0 and worker.stats.renders > worker.stats.render_passes


def test_renders_on_a_thread_of_their_own_sound_as_on_the_worker(tiny_bundle):
    """A worker with a render thread (the server's default on two threads) overlaps renders with the other
    streams' decoder steps: each stream's codes and audio are the ones it gets with renders on the worker."""
    import numpy as np

    bundle = tiny_bundle(2)
    inline = asyncio.run(_speak_together(bundle, StreamWorker(2, render_thread=False), [0.0, 0.0, 0.01]))
    threaded_worker = StreamWorker(2)
    assert threaded_worker.render_thread and threaded_worker.renders == "thread-batched"
    assert (threaded_worker.step_threads, threaded_worker.render_threads) == (1, 1)
    threaded = asyncio.run(_speak_together(bundle, threaded_worker, [0.0, 0.0, 0.01]))
    for a, t in zip(inline, threaded):
        assert torch.equal(codes_of(a), codes_of(t))
        one, other = np.concatenate([c.samples for c in a]), np.concatenate([c.samples for c in t])
        assert one.shape == other.shape and len(one) > 0
        np.testing.assert_allclose(other, one, atol=1e-4 * max(1e-3, float(np.abs(one).max())) + 1e-6)
    assert threaded_worker.live_streams == 0 and threaded_worker._in_render == 0 and not threaded_worker._rendered


def test_a_streams_last_audio_renders_on_the_render_thread(tiny_bundle, monkeypatch):
    """The codec's flush at a stream's end is a render like the others: with a render thread it runs there, not
    between the other streams' decoder steps (alone, or with the flushes due beside it: `flush_many`)."""
    import threading

    import tts.inference.batching as batching
    from tts.codec.mel_codec import StreamingMelDecoder

    flushed_on, flush, flush_many = {}, StreamingMelDecoder.flush, batching.flush_many  # stream -> thread

    def noting_flush(self):
        flushed_on[self] = threading.current_thread().name
        return flush(self)

    def noting_flush_many(streams):
        flushed_on.update(dict.fromkeys(streams, threading.current_thread().name))
        return flush_many(streams)

    monkeypatch.setattr(StreamingMelDecoder, "flush", noting_flush)
    monkeypatch.setattr(batching, "flush_many", noting_flush_many)
    worker = StreamWorker(2, render_thread=True)
    together = asyncio.run(_speak_together(tiny_bundle(2), worker, [0.0, 0.0, 0.01]))
    assert all(len(t) for t in together)
    assert len(flushed_on) == len(TEXTS) and all(name.startswith("s5-render") for name in flushed_on.values())


def test_a_render_that_fails_on_the_render_thread_fails_its_stream_alone(tiny_bundle, monkeypatch):
    """The render itself raises on the render thread for one stream: that stream gets the error, the others
    speak what they speak alone, and the worker serves the next request."""
    from tts.inference.synthesis import RenderRequest

    alone = speak_alone(tiny_bundle(2))
    bundle = tiny_bundle(2)
    worker = StreamWorker(2, render_thread=True)
    failing_stream: list = []
    run = RenderRequest.run

    def failing_run(self):
        if self.stream in failing_stream:
            raise RuntimeError("render failed")
        return run(self)

    monkeypatch.setattr(RenderRequest, "run", failing_run)
    original_init = StreamingSynthesizer.__init__

    def marking_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if self.schedule.config.seed == 1 and not failing_stream:  # the first stream of seed 1 only
            failing_stream.append(self.schedule._codec_stream)

    monkeypatch.setattr(StreamingSynthesizer, "__init__", marking_init)

    async def together():
        return await asyncio.gather(*(speak(bundle, t.split(), "s5", config=config(i), max_stretch=1.0, worker=worker)
                                      for i, t in enumerate(TEXTS)), return_exceptions=True)

    results = asyncio.run(together())
    assert isinstance(results[1], RuntimeError) and str(results[1]) == "render failed"
    assert torch.equal(alone[0], codes_of(results[0].chunks)) and torch.equal(alone[2], codes_of(results[2].chunks))
    assert torch.equal(alone[1], codes_of(asyncio.run(speak(bundle, TEXTS[1].split(), "s5", config=config(1),
                                                            max_stretch=1.0, worker=worker)).chunks))
    assert worker._in_render == 0


def test_a_burst_of_openings_renders_half_on_the_worker_thread():
    """Four or more streams' first sounds due in one pass: the least urgent half renders on the worker thread, the
    rest on the render thread; fewer openings, and renders of streams that play, all go to the render thread."""
    from types import SimpleNamespace

    from tts.inference.batching import SHARED_OPENINGS, _Call

    def call(waiting_s: float | None, overlap: bool = False) -> _Call:  # waiting_s None: it has sounded
        schedule = SimpleNamespace(first_sent_ns=None if waiting_s is not None else 1,
                                   urgency_s=lambda: -1e6 - waiting_s if waiting_s is not None else 0.5)
        return _Call(schedule, None, request=SimpleNamespace(overlap=overlap))

    openings = [call(w) for w in (0.3, 0.1, 0.4, 0.2, 0.05)]
    playing = [call(None), call(None, overlap=True)]
    here = StreamWorker._openings_to_render_here(playing + openings)
    assert here == [openings[1], openings[4]]  # the two that waited least, the least urgent last
    assert StreamWorker._openings_to_render_here(playing + openings[: SHARED_OPENINGS - 1]) == []


def test_render_modes_name_their_worker():
    for mode in ("inline", "inline-batched", "thread", "thread-batched"):
        assert StreamWorker.for_renders(2, mode).renders == mode
    assert StreamWorker.for_renders(2).renders == "thread-batched"
    assert StreamWorker.for_renders(1).renders == "inline-batched"
    one = StreamWorker(1)
    assert (one.step_threads, one.render_threads) == (1, 1)  # one thread: renders stay on the worker
    four = StreamWorker(4)
    assert (four.step_threads, four.render_threads) == (2, 2)
    try:
        StreamWorker.for_renders(2, "gpu")
    except ValueError as error:
        assert "inline, inline-batched, thread, thread-batched" in str(error)
    else:
        raise AssertionError("an unknown render mode was taken")


def test_a_closed_worker_can_be_waited_for_and_serves_again(tiny_bundle):
    """`close(wait_s)` returns once the worker thread (and its render thread) ended, so that no daemon thread is
    inside torch when the interpreter exits; a later request starts the worker again."""
    bundle = tiny_bundle(2)
    worker = StreamWorker(2)
    first = asyncio.run(_speak_together(bundle, worker, [0.0, 0.0, 0.0]))
    thread = worker._thread
    worker.close(wait_s=5.0)
    assert thread is None or not thread.is_alive()
    assert worker._thread is None and worker._renderer is None
    again = asyncio.run(_speak_together(bundle, worker, [0.0, 0.0, 0.0]))
    assert [torch.equal(codes_of(a), codes_of(b)) for a, b in zip(first, again)] == [True] * 3
