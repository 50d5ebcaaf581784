"""`s5 bench voice`: spoken questions through the listening path, answers through every TTS mode, voice-to-voice.

Each question of a replay script is spoken by a corpus voice other than the TTS's (flite, festival), played in real
time as microphone blocks (`ArrayMicrophone`) into the same `Listener` `s5 chat --voice` runs (Silero VAD, Whisper
tiny.en); the transcript starts a turn whose LLM is the script's replayed answer. Modes are interleaved per
question, each hearing the question afresh, so every figure covers the whole path from the end of the speech.
"""
from __future__ import annotations

import numpy as np

from audio_io.capture import ArrayMicrophone
from audio_io.sinks import ClockSink
from audio_io.vad import VAD_RATE
from audio_io.wav import resample
from llm.replay import ReplayLLM, ReplayScript
from tts.data.voices import SAMPLE_RATE, VOICES
from tts.inference.streaming import MODES
from tts.inference.synthesis import SynthesisConfig, TTSBundle

from .listen import Listener
from .orchestrator import Agent, AgentConfig
from .records import TurnRecord
from .session import pct

QUESTION_VOICES = ("flite_kal", "festival_ked", "flite_awb", "festival_slt_hts")


async def hear_once(audio: np.ndarray) -> object | None:
    """The first line the listener hears in `audio` (16 kHz, played in real time)."""
    async for heard in Listener(ArrayMicrophone(audio)).lines():
        return heard
    return None


async def bench_voice(script: ReplayScript, bundles: dict[str, TTSBundle], modes: tuple[str, ...] = MODES,
                      seed: int = 0, progress=None) -> dict:
    from tts.eval.metrics import error_rates

    await Listener.warm_up()
    by_mode: dict[str, list[TurnRecord]] = {m: [] for m in modes}
    questions, transcripts = [], []
    task = progress.add_task("bench voice", total=len(script.turns) * len(modes)) if progress else None
    for i, turn in enumerate(script.turns):
        voice = QUESTION_VOICES[i % len(QUESTION_VOICES)]
        spoken = resample(VOICES[voice].synthesize(turn.user).audio, SAMPLE_RATE, VAD_RATE)
        pause = np.zeros(VAD_RATE // 2, np.float32)
        audio = np.concatenate([pause, spoken, pause, pause, pause])  # room for the VAD's end-of-speech pause
        for mode in modes:
            heard = await hear_once(audio)
            if mode == modes[0]:
                questions.append(turn.user)
                transcripts.append(heard.text if heard else "")
            if heard is None or not heard.text:
                by_mode[mode].append(TurnRecord(i + 1, mode, "replay", "", error="heard nothing"))
                continue
            single = ReplayScript(script.name, [turn], script.first_token_ms, script.tokens_per_second)
            agent = Agent(ReplayLLM(single), bundles, ClockSink(bundles[mode].codec.sample_rate, pace=False),
                          AgentConfig(tts_mode=mode, synthesis=SynthesisConfig(seed=seed + i)))
            record = await agent.run_turn(heard.text, heard=heard)
            record.turn = i + 1
            by_mode[mode].append(record)
            if progress:
                progress.advance(task)
    out: dict = {"script": script.name, "questions": len(questions), "question_voices": list(QUESTION_VOICES),
                 "asr_wer": round(error_rates(questions, transcripts)[0], 2),
                 "barge_in": "half-duplex: the microphone is not listened to while the agent speaks, so a played "
                             "reply cannot interrupt itself", "false_barge_ins": 0}
    for mode in modes:
        records = by_mode[mode]
        v2v = [r.voice_to_voice_ms for r in records if r.voice_to_voice_ms is not None]
        asr = [(r.transcript_ready - r.user_speech_end) / 1e6 for r in records if r.transcript_ready and r.user_speech_end]
        out[mode] = {"v2v_ms_p50": pct(v2v, 50), "v2v_ms_p95": pct(v2v, 95),
                     "transcript_after_speech_ms_p50": pct(asr, 50), "underruns": sum(r.underruns for r in records),
                     "errors": sum(bool(r.error) for r in records), "turns": len(records)}
    if "s5" in modes and "t5" in modes and out["s5"]["v2v_ms_p50"] and out["t5"]["v2v_ms_p50"]:
        out["ratio_v2v_s5_over_t5"] = round(out["s5"]["v2v_ms_p50"] / out["t5"]["v2v_ms_p50"], 3)
    return out
