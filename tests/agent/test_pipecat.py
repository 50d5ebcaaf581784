"""`S5TTSService` inside a real pipecat `Pipeline`, run by pipecat's own `PipelineTask` and `PipelineRunner`: LLM
text frames streamed in token by token, audio frames and word-timestamp text frames out; an interruption mid-reply
stops the audio; two services in one process share one batched worker."""
from __future__ import annotations

import asyncio
import warnings

import pytest

pytest.importorskip("pipecat", reason="the pipecat extra: pip install 's5-agent[pipecat]'")

from pipecat.frames.frames import (  # noqa: E402
    EndFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402

from agent.integrations.pipecat import S5TTSService, S5Voice  # noqa: E402
from tts.inference.batching import StreamWorker  # noqa: E402
from tts.inference.synthesis import SynthesisConfig  # noqa: E402

with warnings.catch_warnings():  # the names the issue asks for are pipecat's deprecated aliases in 1.x
    warnings.simplefilter("ignore", DeprecationWarning)
    from pipecat.pipeline.runner import PipelineRunner  # noqa: E402
    from pipecat.pipeline.task import PipelineTask  # noqa: E402

TOKENS = ["Sure", ",", " the", " train", " to", " Lisbon", " leaves", " at", " six", " tonight", "."]


class Collector(FrameProcessor):
    """The end of the pipeline: keeps every frame that reaches it; `on_audio` runs on the first audio frame."""

    def __init__(self, on_audio=None):
        super().__init__()
        self.frames, self.on_audio = [], on_audio

    async def process_frame(self, frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        if isinstance(frame, TTSAudioRawFrame) and self.on_audio is not None:
            callback, self.on_audio = self.on_audio, None
            await callback()
        await self.push_frame(frame, direction)

    def of(self, kind):
        return [f for f in self.frames if isinstance(f, kind)]


def reply_frames(tokens=TOKENS):
    return [LLMFullResponseStartFrame(), *[LLMTextFrame(t) for t in tokens], LLMFullResponseEndFrame()]


@pytest.fixture(scope="module")
def voice(tiny_bundle):
    return S5Voice(tiny_bundle(2), StreamWorker(1), SynthesisConfig(seed=0, max_frames_per_word=4))


async def run(*pipelines_and_frames):
    """Each (pipeline, frames) as its own PipelineTask, all under one PipelineRunner."""
    runner = PipelineRunner(handle_sigint=False)
    tasks = []
    for pipeline, frames in pipelines_and_frames:
        task = PipelineTask(pipeline, cancel_on_idle_timeout=False)
        await task.queue_frames([*frames, EndFrame()])
        tasks.append(task)
    await asyncio.wait_for(asyncio.gather(*(runner.run(task) for task in tasks)), 120)
    return tasks


def test_streamed_tokens_become_audio_and_word_timestamps(voice):
    collector = Collector()
    asyncio.run(run((Pipeline([S5TTSService(voice=voice), collector]), reply_frames())))
    audio = collector.of(TTSAudioRawFrame)
    assert audio and all(f.sample_rate == voice.bundle.codec.sample_rate and f.num_channels == 1 for f in audio)
    words = [f.text for f in collector.of(TTSTextFrame)]
    assert words == ["Sure,", "the", "train", "to", "Lisbon", "leaves", "at", "six", "tonight."]
    assert len(collector.of(TTSStartedFrame)) == 1 and len(collector.of(TTSStoppedFrame)) == 1
    times = [f.pts for f in collector.of(TTSTextFrame)]
    assert times == sorted(times)  # each word when its audio plays


def test_an_interruption_stops_the_reply_within_a_chunk(voice):
    long_reply = TOKENS + [" and", " the", " next", " one", " leaves", " tomorrow", " morning", " at", " nine"] * 4
    collector = Collector()
    service = S5TTSService(voice=voice)

    async def interrupt():
        await pipeline_task.queue_frame(InterruptionFrame())

    collector.on_audio = interrupt
    pipeline = Pipeline([service, collector])
    pipeline_task = None

    async def scenario():
        nonlocal pipeline_task
        runner = PipelineRunner(handle_sigint=False)
        pipeline_task = PipelineTask(pipeline, cancel_on_idle_timeout=False)
        await pipeline_task.queue_frames(reply_frames(long_reply))
        running = asyncio.create_task(runner.run(pipeline_task))
        while not collector.of(InterruptionFrame):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # whatever was still coming would have come by now
        await pipeline_task.queue_frame(EndFrame())
        await asyncio.wait_for(running, 60)

    asyncio.run(scenario())
    after = collector.frames[collector.frames.index(collector.of(InterruptionFrame)[0]):]
    spoken = sum(len(f.audio) for f in collector.of(TTSAudioRawFrame)) / 2 / voice.bundle.codec.sample_rate
    assert not any(isinstance(f, TTSAudioRawFrame) for f in after)  # no audio of the cut reply after it
    assert spoken < 3.0 and not service._utterances  # the reply (several seconds) was cut, its utterance closed


def test_two_services_in_one_process_share_the_batched_worker(voice):
    first, second = Collector(), Collector()
    asyncio.run(run((Pipeline([S5TTSService(voice=voice), first]), reply_frames()),
                    (Pipeline([S5TTSService(voice=voice), second]), reply_frames(TOKENS[::-1]))))
    assert first.of(TTSAudioRawFrame) and second.of(TTSAudioRawFrame)
    assert voice.worker.stats.largest >= 2  # their decoder steps ran in one batch


def test_unspeakable_replies_are_silent_and_the_service_goes_on(voice):
    """Replies with nothing to say (emoji, a code block) give no audio and no error; the next reply speaks."""
    from pipecat.frames.frames import ErrorFrame

    collector, upstream = Collector(), Collector()  # errors travel upstream, towards the task
    frames = reply_frames(["😀", "🎉"]) * 4 + reply_frames(["```", "x = 1", "```"]) + reply_frames()
    asyncio.run(run((Pipeline([upstream, S5TTSService(voice=voice), collector]), frames)))
    assert not upstream.of(ErrorFrame) and not collector.of(ErrorFrame)
    assert [f.text for f in collector.of(TTSTextFrame)][-1] == "tonight." and collector.of(TTSAudioRawFrame)


def test_a_failure_is_one_error_frame_and_the_next_reply_speaks(voice, monkeypatch):
    """The engine failing mid-reply reaches the pipeline as one pipecat ErrorFrame (one line, no traceback in it);
    the service goes on with the next reply."""
    from pipecat.frames.frames import ErrorFrame

    from agent.text_speech import TextSpeech

    chunks, failed = TextSpeech.chunks, []

    async def failing_once(self):
        if not failed:
            failed.append(True)
            raise RuntimeError("the render failed")
        async for chunk in chunks(self):
            yield chunk

    monkeypatch.setattr(TextSpeech, "chunks", failing_once)
    collector, upstream = Collector(), Collector()  # errors travel upstream, towards the task
    asyncio.run(run((Pipeline([upstream, S5TTSService(voice=voice), collector]), reply_frames() + reply_frames())))
    ours = [f for f in upstream.of(ErrorFrame) if f.error.startswith("S5")]
    assert len(ours) == 1 and ours[0].error == "S5 failed to speak: RuntimeError: the render failed"
    assert collector.of(TTSAudioRawFrame)  # the second reply was spoken


@pytest.mark.slow
def test_the_example_pipeline_writes_a_reply(tmp_path):
    """examples/pipecat_agent.py: the embedded LLM and the shipped S5 voice in one pipecat pipeline, a WAV out."""
    import subprocess
    import sys

    from audio_io.wav import read_wav

    out = tmp_path / "reply.wav"
    result = subprocess.run([sys.executable, "examples/pipecat_agent.py", "What is a good name for a cat?",
                             "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-800:]
    audio, rate = read_wav(out)
    assert len(audio) / rate > 0.5 and "s of speech" in result.stdout
