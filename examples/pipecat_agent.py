"""A pipecat pipeline with the embedded LLM and S5: a question in, the reply streamed token by token into
`S5TTSService`, its audio and word times out, written to a WAV.

    .venv/bin/python examples/pipecat_agent.py "What should I pack for a day at the beach?" --out reply.wav

Needs the pipecat extra (`pip install 's5-agent[pipecat]'`; ./setup.sh installs it). In your own app, put a
transport (Daily, WebRTC, a local audio transport) where `WavWriter` is.
"""
from __future__ import annotations

import argparse
import asyncio
import time
import warnings
from pathlib import Path

import numpy as np
from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TextFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from agent.integrations.pipecat import S5TTSService
from audio_io.wav import write_wav
from llm.embedded import EmbeddedLLM

with warnings.catch_warnings():  # pipecat 1.x keeps these names as aliases of its workers
    warnings.simplefilter("ignore", DeprecationWarning)
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineTask


class EmbeddedLLMProcessor(FrameProcessor):
    """A user's question (a TextFrame) -> the embedded model's reply as LLM text frames, as they come."""

    def __init__(self):
        super().__init__()
        self.llm = EmbeddedLLM()
        self.history: list[dict] = []

    async def process_frame(self, frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, TextFrame) and not isinstance(frame, (LLMTextFrame, TTSTextFrame)):
            self.history.append({"role": "user", "content": frame.text})
            await self.push_frame(LLMFullResponseStartFrame())
            reply = []
            async for piece in self.llm.stream(self.history):
                reply.append(piece.text)
                await self.push_frame(LLMTextFrame(piece.text))
            await self.push_frame(LLMFullResponseEndFrame())
            self.history.append({"role": "assistant", "content": "".join(reply)})
        else:
            await self.push_frame(frame, direction)


class WavWriter(FrameProcessor):
    """Where a transport would play the audio: keeps it, and prints each word as its time comes."""

    def __init__(self):
        super().__init__()
        self.audio: list[np.ndarray] = []
        self.rate = 22050
        self.started = time.perf_counter()

    async def process_frame(self, frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.audio.append(np.frombuffer(frame.audio, dtype="<i2").astype(np.float32) / 32768)
            self.rate = frame.sample_rate
        elif isinstance(frame, TTSTextFrame):
            print(f"{time.perf_counter() - self.started:6.2f} s  {frame.text}", flush=True)
        await self.push_frame(frame, direction)


async def main(question: str, out: Path) -> None:
    writer = WavWriter()
    pipeline = Pipeline([EmbeddedLLMProcessor(), S5TTSService(), writer])
    task = PipelineTask(pipeline, cancel_on_idle_timeout=False)
    await task.queue_frames([TextFrame(question), EndFrame()])
    await PipelineRunner(handle_sigint=False).run(task)
    audio = np.concatenate(writer.audio) if writer.audio else np.zeros(0, np.float32)
    write_wav(out, audio, writer.rate)
    print(f"{len(audio) / writer.rate:.2f} s of speech -> {out}")


if __name__ == "__main__":
    logger.remove()  # pipecat logs every frame at DEBUG
    logger.add(lambda message: print(message, end=""), level="WARNING")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="What should I pack for a day at the beach?")
    parser.add_argument("--out", type=Path, default=Path("pipecat_reply.wav"))
    args = parser.parse_args()
    asyncio.run(main(args.question, args.out))
