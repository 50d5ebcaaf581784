"""`s5 wyoming` spoken to by the wyoming package's own client over real TCP, in Home Assistant's order: describe,
a plain synthesize, a streamed reply (first audio before the stream ends, the repeated whole text ignored), bad
events answered with an error on a connection that stays usable, two clients at once on one batched worker."""
from __future__ import annotations

import asyncio

import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from agent.integrations.wyoming import serve_wyoming
from tests.ollama_standin import free_port
from tts.inference.batching import StreamWorker
from tts.inference.synthesis import SynthesisConfig

REPLY = ["The kitchen ", "lights are ", "on, and the ", "front door ", "is locked."]


def run_with_server(bundle, scenario):
    """Start the server on a free port, run `scenario(port, worker)`, stop it."""
    async def main():
        port, worker, started = free_port(), StreamWorker(1), asyncio.Event()
        server = asyncio.create_task(serve_wyoming(f"tcp://127.0.0.1:{port}", bundle,
                                                   SynthesisConfig(seed=0, max_frames_per_word=4), worker, started))
        await started.wait()
        try:
            return await scenario(port, worker)
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)

    return asyncio.run(main())


async def until(client, *types) -> list[Event]:
    """Events until one of `types` (included)."""
    events = []
    while True:
        event = await asyncio.wait_for(client.read_event(), 60)
        assert event is not None
        events.append(event)
        if event.type in types:
            return events


def audio_of(events) -> bytes:
    return b"".join(AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type))


@pytest.fixture(scope="module")
def bundle(tiny_bundle):
    return tiny_bundle(2)


def test_describe_and_a_plain_synthesize(bundle):
    async def scenario(port, worker):
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event((await until(client, "info"))[-1])
            await client.write_event(Synthesize("Hello there, nice to meet you.").event())
            return info, await until(client, AudioStop().event().type)

    info, events = run_with_server(bundle, scenario)
    assert info.tts[0].name == "s5" and info.tts[0].supports_synthesize_streaming and info.tts[0].voices[0].languages == ["en"]
    assert AudioStart.is_type(events[0].type) and AudioStart.from_event(events[0]).rate == bundle.codec.sample_rate
    assert len(audio_of(events)) > 0 and AudioStop.is_type(events[-1].type)


def test_a_streamed_reply_in_home_assistants_order(bundle):
    """Audio starts while the text still streams; the repeated whole text inside the stream is not spoken again:
    the stream's audio is as long as the same text synthesised plainly."""
    async def scenario(port, worker):
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(SynthesizeStart().event())
            for piece in REPLY[:4]:
                await client.write_event(SynthesizeChunk(piece).event())
            early = await until(client, AudioChunk(rate=1, width=2, channels=1, audio=b"").event().type)
            await client.write_event(SynthesizeChunk(REPLY[4]).event())
            await client.write_event(Synthesize("".join(REPLY)).event())  # for servers that do not stream
            await client.write_event(SynthesizeStop().event())
            rest = await until(client, SynthesizeStopped().event().type)
            await client.write_event(Synthesize("".join(REPLY)).event())
            plain = await until(client, AudioStop().event().type)
            return early, rest, plain

    early, rest, plain = run_with_server(bundle, scenario)
    assert AudioStart.is_type(early[0].type) and AudioChunk.is_type(early[-1].type)  # before synthesize-stop was sent
    assert [e.type for e in rest[-2:]] == ["audio-stop", "synthesize-stopped"]
    assert not any(AudioStart.is_type(e.type) for e in rest)  # one audio-start per stream
    streamed, whole = len(audio_of(early + rest)), len(audio_of(plain))
    assert abs(streamed - whole) <= 2 * bundle.codec.samples_per_frame * 2  # once, not twice


def test_bad_events_get_an_error_and_the_connection_stays_usable(bundle):
    async def scenario(port, worker):
        async with AsyncTcpClient("127.0.0.1", port) as client:
            errors = []
            for event in (Event("transcribe", {}), SynthesizeChunk("orphan").event(), Event("synthesize", {})):
                await client.write_event(event)
                errors.append(Error.from_event((await until(client, "error"))[-1]).text)
            await client.write_event(Synthesize("Still here.").event())
            return errors, await until(client, "audio-stop")

    errors, events = run_with_server(bundle, scenario)
    assert "transcribe" in errors[0] and "outside synthesize-start" in errors[1] and "bad synthesize" in errors[2]
    assert len(audio_of(events)) > 0


def test_two_clients_at_once_share_the_batched_worker(bundle):
    async def scenario(port, worker):
        async def one(text):
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Synthesize(text).event())
                return await until(client, "audio-stop")

        both = await asyncio.gather(one("The first client asks for a long enough sentence."),
                                    one("And the second one asks for another long sentence."))
        return both, worker.stats.largest

    both, largest = run_with_server(bundle, scenario)
    assert all(len(audio_of(events)) > 0 for events in both) and largest == 2  # their steps ran together
