"""Sinks: the simulated clock, WAV recording with barge-in trimming, and the headless fallback."""
import asyncio
import time

import numpy as np
import pytest

from audio_io.sinks import ClockSink, WavSink, open_sink
from audio_io.wav import read_wav

RATE = 1000


def test_clock_sink_counts_underruns_only_when_audio_is_late():
    sink = ClockSink(RATE)
    sink.begin_turn()
    sink.write(np.zeros(200))  # 200 ms of silence queued: the next chunk is on time
    sink.write(np.full(100, 0.1))
    assert sink.stats.underruns == 0
    first = sink.stats.first_audible_ns - sink.stats.first_played_ns
    assert first == pytest.approx(200e6, abs=1e3)  # audible once the silence has played
    time.sleep(0.35)  # the player runs dry
    sink.write(np.full(10, 0.1))
    assert sink.stats.underruns == 1 and sink.stats.underrun_ms >= 40
    [[at_s, gap_ms]] = sink.stats.gaps  # where in the audio it ran dry (after 0.3 s) and for how long
    assert at_s == pytest.approx(0.3) and gap_ms == pytest.approx(sink.stats.underrun_ms)
    sink.begin_turn()
    assert sink.stats.underruns == 0 and sink.stats.first_audible_ns is None


def test_clock_sink_waits_for_the_pacing_prebuffer():
    sink = ClockSink(RATE, start_buffer_ms=0)
    sink.begin_turn()
    hold_until = time.perf_counter_ns() + int(0.5e9)
    sink.write(np.full(100, 0.1), play_after_ns=hold_until)
    assert sink.stats.first_played_ns == hold_until  # the simulated clock starts when the engine asked
    time.sleep(0.2)
    sink.write(np.full(100, 0.1))  # arrives before the first chunk would even have started: no underrun
    assert sink.stats.underruns == 0


def test_wav_sink_records_and_barge_in_drops_the_unplayed_tail(tmp_path):
    sink = WavSink(RATE, tmp_path / "a.wav")
    sink.begin_turn()
    sink.write(np.full(5000, 0.25))  # 5 s queued, nothing played yet
    dropped = sink.flush()
    assert 4500 <= dropped <= 5000
    sink.write(np.full(300, -0.25))
    path = sink.save()
    audio, rate = read_wav(path)
    assert rate == RATE and len(audio) == 5000 - dropped + 300
    assert audio[-1] == pytest.approx(-0.25, abs=1e-3)


def test_unpaced_sink_drains_at_once(monkeypatch):
    """An unpaced sink's drain asks for no wait; a paced one waits for the minute of audio to play."""
    import audio_io.sinks as sinks

    waits: list[float] = []

    async def recorded_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(sinks.asyncio, "sleep", recorded_sleep)
    for pace in (False, True):
        sink = ClockSink(RATE, pace=pace)
        sink.begin_turn()
        sink.write(np.zeros(60 * RATE))  # a minute of audio
        sink.end_turn()
        asyncio.run(sink.drain())
    assert len(waits) == 1 and 55 < waits[0] <= 60


def test_auto_output_falls_back_to_wav_with_one_line(tmp_path, monkeypatch):
    import audio_io.sinks as sinks

    def no_device(*args, **kwargs):
        raise sinks.AudioDeviceError("cannot open audio device (default): Error querying device -1")

    monkeypatch.setattr(sinks, "DeviceSink", no_device)
    notices = []
    sink = open_sink("auto", RATE, tmp_path / "out.wav", notice=notices.append)
    assert isinstance(sink, WavSink) and len(notices) == 1 and "\n" not in notices[0]
    with pytest.raises(sinks.AudioDeviceError):
        open_sink("device", RATE)
    with pytest.raises(ValueError, match="unknown audio output"):
        open_sink("speakers", RATE)
