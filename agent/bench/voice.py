"""`s5 bench voice`: spoken questions through the listening path, answers through every TTS mode, voice-to-voice.

Each question of a replay script is spoken by a corpus voice other than the TTS's (flite, festival) and played in
real time as microphone blocks into the `Listener` and turn-taking (`SpokenTurns`) that `s5 chat --voice` runs:
Silero VAD, Whisper tiny.en, the turn started on the VAD's guess and held silent until the pause is confirmed.
The microphone also hears the agent: what the player plays comes back into it at full level (`coupling_db` 0, a
digital loopback, the worst case for the echo gate) `echo_delay_ms` later, so a reply interrupting itself is
counted (`false_barge_ins`), as is any line the agent's own voice made (`echo_lines`). The LLM is the script's
replayed answer. Modes are interleaved per question, each hearing the question afresh, so every figure covers
the whole path from the end of the speech.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import numpy as np

from audio_io.capture import CAPTURE_BLOCK
from audio_io.echo import EchoGate
from audio_io.sinks import ClockSink
from audio_io.vad import VAD_RATE
from audio_io.wav import resample
from llm.replay import ReplayLLM, ReplayScript
from tts.data.voices import SAMPLE_RATE, VOICES
from tts.inference.streaming import MODES
from tts.inference.synthesis import SynthesisConfig, TTSBundle

from agent.chat import SpokenTurns
from agent.listen import HeardLine, Listener
from agent.orchestrator import Agent, AgentConfig
from agent.records import TurnRecord
from tts.eval.stream_bench import percentile as pct

QUESTION_VOICES = ("flite_kal", "festival_ked", "flite_awb", "festival_slt_hts")


class LoopbackSink(ClockSink):
    """A real-time clock player that keeps what it played with the time it played, for a microphone to hear."""

    def __init__(self, sample_rate: int):
        super().__init__(sample_rate, pace=True)
        self.played: list[tuple[int, np.ndarray]] = []  # (time of the first sample, samples)

    def _record(self, samples: np.ndarray) -> None:
        self.played.append((self._clock - round(len(samples) / self.sample_rate * 1e9), samples))

    def flush(self) -> int:
        dropped = super().flush()
        now = time.perf_counter_ns()
        kept = []
        for start, samples in self.played:  # what was dropped never reached the loudspeaker
            if start < now:
                kept.append((start, samples[: max(0, round((now - start) / 1e9 * self.sample_rate))]))
        self.played = kept
        return dropped

    def heard(self, start_ns: int, n: int, rate: int) -> np.ndarray:
        """n samples at `rate` of what played from start_ns on (silence where nothing played)."""
        own = round(n * self.sample_rate / rate) + 1
        out = np.zeros(own, np.float32)
        for begin, samples in self.played:
            offset = round((begin - start_ns) / 1e9 * self.sample_rate)
            lo, hi = max(0, offset), min(own, offset + len(samples))
            if lo < hi:
                out[lo:hi] += samples[lo - offset : hi - offset]
        return np.interp(np.arange(n) * self.sample_rate / rate, np.arange(own), out).astype(np.float32)


class LoopbackMicrophone:
    """The question in real time, with the player's output mixed in `delay_ms` later at `coupling_db`; runs until
    `stop` is set."""

    def __init__(self, question: np.ndarray, sink: LoopbackSink, stop: asyncio.Event, coupling_db: float = 0.0,
                 delay_ms: float = 30.0, rate: int = VAD_RATE, block: int = CAPTURE_BLOCK):
        self.question, self.sink, self.stop = question, sink, stop
        self.gain, self.delay_ns = 10 ** (coupling_db / 20), round(delay_ms * 1e6)
        self.rate, self.block = rate, block

    async def blocks(self) -> AsyncIterator[tuple[np.ndarray, int]]:
        start, i = time.perf_counter_ns(), 0
        while not self.stop.is_set():
            captured = start + round(i / self.rate * 1e9)
            await asyncio.sleep(max(0.0, (captured + round(self.block / self.rate * 1e9) - time.perf_counter_ns()) / 1e9))
            block = np.zeros(self.block, np.float32)
            spoken = self.question[i : i + self.block]
            block[: len(spoken)] = spoken
            block += self.gain * self.sink.heard(captured - self.delay_ns, self.block, self.rate)
            yield block, captured
            i += self.block

    def close(self) -> None:
        pass


async def ask(agent: Agent, sink: LoopbackSink, question: np.ndarray, tail_s: float = 1.0) -> tuple[list[TurnRecord], HeardLine | None, SpokenTurns, int]:
    """Speak one question into the loopback microphone; return the turns it started, the final line heard first,
    the turn-taking state (its barge-ins are false ones: nobody speaks after the question) and the lines heard
    after the first (made by the agent's own voice)."""
    stop = asyncio.Event()
    listener = Listener(LoopbackMicrophone(question, sink, stop), echo=EchoGate(sink.levels))
    spoken = SpokenTurns(agent, full_duplex=True)
    records: list[TurnRecord] = []
    turns: list[asyncio.Task] = []
    first: HeardLine | None = None
    extra_lines = 0
    speaking = lambda: any(not t.done() for t in turns)  # noqa: E731
    question_ends_ns = time.perf_counter_ns() + round(len(question) / VAD_RATE * 1e9)

    async def listen() -> None:
        nonlocal first, extra_lines
        async for event in listener.events():
            if isinstance(event, HeardLine) and not event.guess:
                if first is None:
                    first = event
                elif event.text:
                    extra_lines += 1
            line = spoken.on_event(event, speaking())
            if line is not None:
                turns.append(asyncio.create_task(spoken.run_turn(line.text, line)))

    listening = asyncio.create_task(listen())
    while time.perf_counter_ns() < question_ends_ns or speaking() or (first is None and time.perf_counter_ns() < question_ends_ns + 3e9):
        await asyncio.sleep(0.05)
    await asyncio.sleep(tail_s)  # the echo of the reply's end has to pass the gate too
    stop.set()
    await listening
    for task in turns:
        records.append(await task)
    return records, first, spoken, extra_lines


async def bench_voice(script: ReplayScript, bundles: dict[str, TTSBundle], modes: tuple[str, ...] = MODES,
                      seed: int = 0, progress=None) -> dict:
    from tts.eval.metrics import error_rates

    await Listener.warm_up()
    by_mode: dict[str, list[TurnRecord]] = {m: [] for m in modes}
    counts = {m: {"false_barge_ins": 0, "echo_lines": 0, "retracted": 0} for m in modes}
    questions, transcripts = [], []
    task = progress.add_task("bench voice", total=len(script.turns) * len(modes)) if progress else None
    for i, turn in enumerate(script.turns):
        voice = QUESTION_VOICES[i % len(QUESTION_VOICES)]
        spoken_question = resample(VOICES[voice].synthesize(turn.user).audio, SAMPLE_RATE, VAD_RATE)
        question = np.concatenate([np.zeros(VAD_RATE // 2, np.float32), spoken_question])
        for mode in modes:
            single = ReplayScript(script.name, [turn], script.first_token_ms, script.tokens_per_second)
            sink = LoopbackSink(bundles[mode].codec.sample_rate)
            agent = Agent(ReplayLLM(single), bundles, sink, AgentConfig(tts_mode=mode, synthesis=SynthesisConfig(seed=seed + i)))
            records, heard, spoken, extra_lines = await ask(agent, sink, question)
            if mode == modes[0]:
                questions.append(turn.user)
                transcripts.append(heard.text if heard else "")
            answered = [r for r in records if not r.retracted]
            counts[mode]["false_barge_ins"] += spoken.barge_ins
            counts[mode]["echo_lines"] += extra_lines
            counts[mode]["retracted"] += len(records) - len(answered)
            record = answered[0] if answered else TurnRecord(i + 1, mode, "replay", "", error="heard nothing")
            record.turn = i + 1
            by_mode[mode].append(record)
            if progress:
                progress.advance(task)
    out: dict = {"script": script.name, "questions": len(questions), "question_voices": list(QUESTION_VOICES),
                 "asr_wer": round(error_rates(questions, transcripts)[0], 2),
                 "echo": "the reply comes back into the microphone at full level (0 dB, 30 ms later); the echo gate's "
                         "margin is 6 dB"}
    for mode in modes:
        records = by_mode[mode]
        v2v = [r.voice_to_voice_ms for r in records if r.voice_to_voice_ms is not None]
        asr = [(r.transcript_ready - r.user_speech_end) / 1e6 for r in records if r.transcript_ready and r.user_speech_end]
        out[mode] = {"v2v_ms_p50": pct(v2v, 50), "v2v_ms_p95": pct(v2v, 95),
                     "transcript_after_speech_ms_p50": pct(asr, 50), "underruns": sum(r.underruns for r in records),
                     "started_on_guess": sum(r.started_on_guess for r in records), **counts[mode],
                     "errors": sum(bool(r.error) for r in records), "turns": len(records),
                     "underrun_turns": [{"turn": r.turn, "gaps": r.gaps} for r in records if r.underruns]}
    if "s5" in modes and "t5" in modes and out["s5"]["v2v_ms_p50"] and out["t5"]["v2v_ms_p50"]:
        out["ratio_v2v_s5_over_t5"] = round(out["s5"]["v2v_ms_p50"] / out["t5"]["v2v_ms_p50"], 3)
    return out
