"""A whole agent turn through sounddevice into a PulseAudio null sink, recorded from the sink's monitor with
`parec`: what the listener would hear must be what the agent sent (`docs/architecture.md`, section 7)."""
import asyncio
import os
import shutil
import signal
import subprocess
import time
import wave

import numpy as np
import pytest
from scipy.signal import butter, correlate, resample_poly, sosfiltfilt

from agent.orchestrator import Agent, AgentConfig
from llm.replay import ReplayLLM, ReplayScript
from tts.inference.synthesis import SynthesisConfig

RATE = 22050
SINK = "s5null"


@pytest.fixture(scope="module")
def pulse(tmp_path_factory):
    if not shutil.which("pulseaudio") or not shutil.which("parecord"):
        if os.environ.get("CI"):
            pytest.fail("pulseaudio / parec missing: ./setup.sh installs pulseaudio and pulseaudio-utils")
        pytest.skip("pulseaudio not installed (./setup.sh installs it)")
    runtime = tmp_path_factory.mktemp("pulse")
    runtime.chmod(0o700)
    old = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    subprocess.run(["pulseaudio", "-D", "--exit-idle-time=-1", "-n", f"--load=module-null-sink sink_name={SINK}",
                    "--load=module-native-protocol-unix"], check=True, capture_output=True, timeout=30)
    for _ in range(50):
        if subprocess.run(["pactl", "info"], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    import sounddevice as sd

    sd._terminate()  # PortAudio lists devices once: look again now that the server runs
    sd._initialize()
    yield
    subprocess.run(["pulseaudio", "--kill"], capture_output=True)
    if old is None:
        os.environ.pop("XDG_RUNTIME_DIR", None)
    else:
        os.environ["XDG_RUNTIME_DIR"] = old


class Recorded:
    """The device sink, remembering every sample it was given."""

    def __init__(self, sink):
        self.sink, self.sent = sink, []

    def write(self, samples, play_after_ns=None):
        self.sent.append(np.clip(samples, -1, 1).astype(np.float32))
        self.sink.write(samples, play_after_ns)

    def __getattr__(self, name):
        return getattr(self.sink, name)


def test_a_turn_played_through_pulseaudio_is_what_was_sent(pulse, tiny_bundle, tmp_path):
    from audio_io.sinks import DeviceSink
    from tts.codec.load import load_codec
    from tts.inference.synthesis import TTSBundle

    tiny = tiny_bundle(2)
    bundles = {"s5": TTSBundle(tiny.model, tiny.symbols, load_codec(), tiny.g2p)}  # the shipped codec and vocoder
    script = ReplayScript.from_dict({"llm": {"first_token_ms": 10, "tokens_per_second": 100},
                                     "turns": [{"user": "hi", "assistant": "Hello there, this goes to the sound card."}]})
    # record in the null sink's own format (resampling inside parec drops data here) into a WAV that parecord
    # finalises on SIGINT, then convert
    recording = tmp_path / "heard.wav"
    recorder = subprocess.Popen(["parecord", "-d", f"{SINK}.monitor", "--rate=44100", "--channels=2", "--format=s16le",
                                 "--latency-msec=20", "--file-format=wav", str(recording)])
    time.sleep(0.3)
    sink = Recorded(DeviceSink(RATE, "pulse", start_buffer_ms=10_000))  # plays once the turn is complete: no gaps
    agent = Agent(ReplayLLM(script), bundles, sink, AgentConfig(synthesis=SynthesisConfig(seed=0, max_frames_per_word=6)))
    record = asyncio.run(agent.run_turn("hi"))
    time.sleep(0.5)
    sink.close()
    recorder.send_signal(signal.SIGINT)
    recorder.wait(timeout=10)
    with wave.open(str(recording)) as f:
        raw = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    heard = resample_poly(raw[: len(raw) // 2 * 2].reshape(-1, 2).mean(axis=1) / 32768, 1, 2).astype(np.float32)
    sent = np.concatenate(sent_parts) if (sent_parts := sink.sent) else np.zeros(0, np.float32)
    assert record.error is None and len(sent) > RATE // 2 and np.abs(sent).max() > 0.01
    # find the sent audio in the recording and compare sample by sample below 7 kHz (the resamplers on the way
    # to the 44.1 kHz sink and back shape the top of the band)
    lowpass = butter(8, 7000, fs=RATE, output="sos")
    heard, sent = sosfiltfilt(lowpass, heard), sosfiltfilt(lowpass, sent)
    # (the monitor only streams while the sink runs, so the very start of playback may be missing: align on a
    # piece from the middle and compare everything after the first 100 ms)
    skip = RATE // 10
    probe = sent[skip : skip + RATE // 2]
    offset = int(np.argmax(correlate(heard, probe, mode="valid", method="fft"))) - skip
    start = max(skip, -offset)  # sent[i] was heard at heard[i + offset]
    sent = sent[start:]
    segment = heard[start + offset :][: len(sent)]
    assert len(segment) >= len(sent) - RATE // 20, (len(heard), len(sent), offset)
    sent = sent[: len(segment)]
    correlation = float(np.dot(segment, sent) / (np.linalg.norm(segment) * np.linalg.norm(sent)))
    assert correlation > 0.9
    assert 0.8 < np.linalg.norm(segment) / np.linalg.norm(sent) < 1.25  # same loudness
    assert record.stamp("first_audible_sample") is not None  # underruns are the benches' figure, not a test's


def test_a_spoken_question_is_heard_and_answered_through_pulseaudio(pulse, tmp_path):
    """The virtual microphone (the null sink's monitor as the default source) hears a question played into the
    sink; the real capture path (sounddevice, VAD, Whisper) transcribes it; the shipped S5 answers through the
    sound card, and the recorded answer, transcribed, holds the reply's words."""
    from agent.listen import Listener
    from audio_io.asr import transcribe
    from audio_io.capture import Microphone
    from audio_io.sinks import DeviceSink
    from audio_io.wav import write_wav
    from tts.data.voices import SAMPLE_RATE, VOICES
    from tts.inference.streaming import load_bundle

    subprocess.run(["pactl", "set-default-source", f"{SINK}.monitor"], check=True, capture_output=True)
    question = tmp_path / "question.wav"
    write_wav(question, VOICES["flite_kal"].synthesize("What is the capital of France?").audio, SAMPLE_RATE)
    reply = "Paris is the capital of France."
    script = ReplayScript.from_dict({"llm": {"first_token_ms": 10, "tokens_per_second": 50},
                                     "turns": [{"user": "question", "assistant": reply}]})
    bundle = load_bundle("s5")
    answer = tmp_path / "answer.wav"

    async def scenario():
        await Listener.warm_up()
        microphone = Microphone()
        player = subprocess.Popen(["paplay", "-d", SINK, str(question)])
        heard = None
        try:
            async for heard in Listener(microphone).lines():
                break
        finally:
            microphone.close()
            player.wait(timeout=10)
        recorder = subprocess.Popen(["parecord", "-d", f"{SINK}.monitor", "--rate=44100", "--channels=2",
                                     "--format=s16le", "--file-format=wav", str(answer)])
        await asyncio.sleep(0.3)
        sink = DeviceSink(bundle.codec.sample_rate)
        agent = Agent(ReplayLLM(script), {"s5": bundle}, sink, AgentConfig(synthesis=SynthesisConfig(seed=0)))
        record = await agent.run_turn(heard.text, heard=heard)
        await asyncio.sleep(0.5)
        sink.close()
        recorder.send_signal(signal.SIGINT)
        recorder.wait(timeout=10)
        return heard, record

    heard, record = asyncio.run(scenario())
    assert {"capital", "france"} <= set(heard.text.lower().replace("?", "").split())
    assert record.error is None and record.voice_to_voice_ms is not None
    with wave.open(str(answer)) as f:
        raw = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    audio = raw[: len(raw) // 2 * 2].reshape(-1, 2).mean(axis=1).astype(np.float32) / 32768
    words = set(transcribe(audio, 44100).lower().replace(".", " ").replace(",", " ").split())
    assert len({"paris", "capital", "france"} & words) >= 2, words


def test_speaking_over_the_answer_interrupts_it_through_pulseaudio(pulse, tmp_path):
    """Full duplex through the real sound path: a question played into the virtual microphone is answered by the
    shipped S5 on another sink; a second question played 6 dB up while the answer sounds passes the echo gate,
    interrupts the answer and becomes the next turn.

    The gate is told the loudspeaker reaches the microphone 10 dB down (a loudspeaker at arm's length; here the two
    sinks have no path between them at all). At the default 0 dB, the worst case, a user must speak about 12 dB
    over the answer's average level: this question passed in 59 of 113 start times against the shipped S5's story
    and 40 of 101 against a voice 1.6 dB louder (simulated on the levels), so CI failed by chance;
    at -10 dB it passes at every start time for both."""
    from agent.listen import Listener
    from agent.chat import SpokenTurns
    from audio_io.capture import Microphone
    from audio_io.echo import EchoGate
    from audio_io.sinks import DeviceSink
    from audio_io.wav import write_wav
    from tts.data.voices import SAMPLE_RATE, VOICES
    from tts.inference.streaming import load_bundle

    subprocess.run(["pactl", "load-module", "module-null-sink", "sink_name=s5out"], check=True, capture_output=True)
    subprocess.run(["pactl", "set-default-sink", "s5out"], check=True, capture_output=True)
    subprocess.run(["pactl", "set-default-source", f"{SINK}.monitor"], check=True, capture_output=True)
    first, second = tmp_path / "first.wav", tmp_path / "second.wav"
    write_wav(first, VOICES["flite_kal"].synthesize("Tell me a long story about a dragon.").audio, SAMPLE_RATE)
    write_wav(second, np.clip(2 * VOICES["festival_ked"].synthesize("What is the capital of Germany?").audio, -1, 1), SAMPLE_RATE)
    story = " ".join(["Once upon a time a small green dragon lived in a cave by the sea, and every morning it flew"] * 4)
    script = ReplayScript.from_dict({"llm": {"first_token_ms": 10, "tokens_per_second": 30},
                                     "turns": [{"user": "story", "assistant": story},
                                               {"user": "capital", "assistant": "Berlin is the capital of Germany."}]})
    bundle = load_bundle("s5")

    async def scenario():
        await Listener.warm_up()
        microphone, sink = Microphone(), DeviceSink(bundle.codec.sample_rate)
        agent = Agent(ReplayLLM(script), {"s5": bundle}, sink, AgentConfig(synthesis=SynthesisConfig(seed=0)))
        spoken = SpokenTurns(agent, full_duplex=True)
        turns: list[asyncio.Task] = []

        async def listen():
            async for event in Listener(microphone, echo=EchoGate(sink.levels, coupling_db=-10.0)).events():
                line = spoken.on_event(event, any(not t.done() for t in turns))
                if line is not None:
                    turns.append(asyncio.create_task(spoken.run_turn(line.text, line)))

        listening = asyncio.create_task(listen())
        try:
            subprocess.run(["paplay", "-d", SINK, str(first)], check=True, timeout=20)
            deadline = time.monotonic() + 30
            while not (turns and sink.stats.first_audible_ns is not None) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # the story is playing
            subprocess.run(["paplay", "-d", SINK, str(second)], check=True, timeout=20)
            while (len(turns) < 2 or not turns[1].done()) and time.monotonic() < deadline + 30:
                await asyncio.sleep(0.1)
        finally:
            listening.cancel()
            microphone.close()
            sink.close()
        return [t.result() for t in turns if t.done()]

    try:
        records = asyncio.run(scenario())
    finally:
        subprocess.run(["pactl", "set-default-sink", SINK], capture_output=True)  # as the other tests expect
    assert len(records) == 2, records
    story_turn, question_turn = records
    assert story_turn.cancelled and story_turn.synthesis.audio_s < 10  # interrupted long before the story's end
    assert {"capital", "germany"} <= set(question_turn.user.lower().replace("?", "").split())
    assert question_turn.error is None and not question_turn.cancelled and question_turn.synthesis.audio_s > 0


def test_an_interrupted_turn_keeps_the_words_heard_through_pulseaudio(pulse, tiny_bundle):
    """Through the sound card (the null sink): interrupted once the device has played into the fourth word, the
    history the next turn sends holds four words (one either way), marked as interrupted."""
    from agent.orchestrator import INTERRUPTED_MARK
    from audio_io.sinks import DeviceSink
    from tts.codec.load import load_codec
    from tts.inference.synthesis import TTSBundle

    tiny = tiny_bundle(2)
    bundles = {"s5": TTSBundle(tiny.model, tiny.symbols, load_codec(), tiny.g2p)}
    reply = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen."
    script = ReplayScript.from_dict({"llm": {"first_token_ms": 10, "tokens_per_second": 60},
                                     "turns": [{"user": "Count.", "assistant": reply}, {"user": "Go on.", "assistant": "Okay."}]})
    sink = DeviceSink(RATE, "pulse")
    agent = Agent(ReplayLLM(script), bundles, sink, AgentConfig(synthesis=SynthesisConfig(seed=0, max_frames_per_word=6)))

    async def scenario():
        turn = asyncio.create_task(agent.run_turn("Count."))
        while True:
            record = agent.turn_record
            started = record.synthesis.words_started if record and record.synthesis else []
            if len(started) >= 5 and sink.stats.played_samples / RATE > started[3].start_s + 0.02:
                break
            await asyncio.sleep(0.005)
        agent.interrupt()
        first = await turn
        return first, agent.messages_for("Go on.")

    try:
        first, messages = asyncio.run(scenario())
    finally:
        sink.close()
    heard = messages[-2]["content"].removesuffix(INTERRUPTED_MARK).split()
    assert first.cancelled and messages[-2]["content"].endswith(INTERRUPTED_MARK)
    assert 3 <= len(heard) <= 5 and reply.startswith(" ".join(heard))
    assert first.words_heard == len(heard) and first.words_written == 16
