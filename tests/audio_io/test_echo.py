"""Full-duplex listening: the echo gate tells the user's voice from the agent's own coming back into the microphone,
and the listener's turn-taking events (a guess, then its confirmation or `SpeechResumed`)."""
import asyncio
import time

import numpy as np
import pytest

from agent.listen import HeardLine, Listener, SpeechResumed, UserSpeaking
from audio_io.echo import EchoGate, PlaybackLevels, level_dbfs, window_levels_dbfs
from audio_io.vad import VAD_RATE
from audio_io.wav import read_wav, resample

BLOCK = 512


class StampedMicrophone:
    """Blocks of an array stamped as captured from `start_ns` on, without waiting (the gate reads the stamps)."""

    def __init__(self, audio: np.ndarray, start_ns: int, rate: int = VAD_RATE):
        self.audio, self.start_ns, self.rate = audio.astype(np.float32), start_ns, rate

    async def blocks(self):
        for i in range(0, len(self.audio), BLOCK):
            await asyncio.sleep(0)
            yield self.audio[i : i + BLOCK], self.start_ns + round(i / self.rate * 1e9)


@pytest.fixture(scope="module")
def voice() -> tuple[np.ndarray, int]:
    audio, rate = read_wav("tests/data/piper_fox.wav")
    return audio, rate


def events(audio: np.ndarray, levels: PlaybackLevels | None, start_ns: int) -> list:
    async def run():
        echo = EchoGate(levels) if levels is not None else None
        return [e async for e in Listener(StampedMicrophone(audio, start_ns), echo=echo).events()]

    return asyncio.run(run())


def test_level_of_a_full_scale_sine_and_of_silence():
    sine = np.sin(np.arange(16000) * 2 * np.pi * 440 / 16000)
    assert level_dbfs(sine) == pytest.approx(-3.01, abs=0.05)
    assert level_dbfs(np.zeros(100)) == -100.0


def test_a_player_levels_each_window_as_the_block_level_does():
    rng = np.random.default_rng(0)
    samples = np.concatenate([rng.normal(0, 0.2, 500), np.zeros(300), rng.normal(0, 0.01, 137)]).astype(np.float32)
    window = 100
    rms = [np.sqrt(np.mean(samples[i : i + window].astype(np.float64) ** 2)) for i in range(0, len(samples), window)]
    expected = [20 * np.log10(r) if r > 0 else -100.0 for r in rms]
    assert expected == pytest.approx([level_dbfs(samples[i : i + window]) for i in range(0, len(samples), window)])
    assert window_levels_dbfs(samples, window) == pytest.approx(expected, abs=1e-9)  # the 37-sample tail too
    played = PlaybackLevels()
    played.add(1_000_000_000, samples, 10_000)  # 10 ms windows of 100 samples: the 6th window (0.05 s in) is silent
    assert played.loudest(1_050_000_000, 1_050_000_000) == -100.0
    assert played.loudest(1_000_000_000, 1_090_000_000) == pytest.approx(max(expected))


def test_the_agents_own_voice_never_interrupts_but_a_louder_user_does(voice):
    audio, rate = voice
    start = time.perf_counter_ns()
    played = PlaybackLevels()
    played.add(start, audio, rate)  # the agent says it; the microphone hears it back at full level
    mic = resample(audio, rate, VAD_RATE)
    pause = np.zeros(VAD_RATE, np.float32)
    heard_echo = events(np.concatenate([mic, pause]), played, start)
    assert not [e for e in heard_echo if isinstance(e, (UserSpeaking, HeardLine))]  # no barge-in, no line
    louder = np.clip(mic * 4.0, -1, 1)  # the user, 12 dB over the agent's echo
    barged = events(np.concatenate([louder, pause]), played, start)
    assert isinstance(barged[0], UserSpeaking)
    assert any(isinstance(e, HeardLine) and not e.guess and "fox" in e.text.lower() for e in barged)
    # with nothing played, speech is the user's at once
    assert isinstance(events(np.concatenate([mic, pause]), PlaybackLevels(), start)[0], UserSpeaking)


def test_a_guess_comes_early_and_speech_that_resumes_withdraws_it(voice, monkeypatch):
    """The turn-taking events, with a stand-in for Whisper so the guess is ready the moment it is asked for
    (the real one is timed in the voice bench). The stand-in runs in place of the transcription thread: on a
    thread it could still be running when the pause's last block came, however short its work (seen on a busy
    machine), and the result would depend on the scheduler, not on the listener."""
    import agent.listen

    async def at_once(function, *args):
        return function(*args)

    monkeypatch.setattr(agent.listen, "transcribe", lambda audio, rate: "the quick brown fox")
    monkeypatch.setattr(agent.listen.asyncio, "to_thread", at_once)
    audio, rate = voice
    mic = resample(audio, rate, VAD_RATE)
    short_pause, pause = np.zeros(int(0.45 * VAD_RATE), np.float32), np.zeros(VAD_RATE, np.float32)
    stream = np.concatenate([pause, mic, short_pause, mic, pause])
    kinds = []
    for e in events(stream, None, time.perf_counter_ns()):
        if isinstance(e, HeardLine):
            kinds.append("guess" if e.guess else "final")
        elif isinstance(e, SpeechResumed):
            kinds.append("resumed")
    assert kinds[-2:] == ["guess", "final"]  # the last pause is the end: its guess, then the same line final
    assert "resumed" in kinds and kinds.index("resumed") > kinds.index("guess")  # the 450 ms pause was not the end
    assert kinds.count("final") == 1  # one utterance: the fox twice, with a pause inside
