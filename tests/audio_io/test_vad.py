"""Hearing the user: the Silero VAD segmenter on a spoken question (a corpus voice other than the TTS's), the
listener from (virtual) microphone blocks to a Whisper transcript."""
import asyncio

import numpy as np
import pytest

from agent.listen import Listener
from audio_io.capture import ArrayMicrophone
from audio_io.vad import VAD_RATE, SpeechSegmenter, VadConfig
from audio_io.wav import resample
from tts.data.voices import SAMPLE_RATE, VOICES

QUESTION = "What is the weather like in Paris tomorrow?"


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    return resample(VOICES["flite_kal"].synthesize(QUESTION).audio, SAMPLE_RATE, VAD_RATE)


def segment(stream: np.ndarray, config: VadConfig | None = None, block: int = 800):
    segmenter, out = SpeechSegmenter(config), []
    for i in range(0, len(stream), block):  # blocks that are not the VAD's own size
        out += segmenter.push(stream[i : i + block])
    return out + segmenter.flush()


def test_one_utterance_per_question_with_its_boundaries_and_no_turn_for_silence_or_noise(question):
    second = np.zeros(VAD_RATE, np.float32)
    noise = np.random.default_rng(0).normal(0, 0.01, 2 * VAD_RATE).astype(np.float32)  # -40 dBFS hiss
    stream = np.concatenate([second, question, second, noise, question, second])
    spoken = np.flatnonzero(np.abs(question) > 0.01)
    first, last = spoken[0] / VAD_RATE, spoken[-1] / VAD_RATE
    utterances = segment(stream)
    assert len(utterances) == 2 and not any(u.cut for u in utterances)
    for u, offset in zip(utterances, (1.0, 1.0 + len(question) / VAD_RATE + 3.0)):
        assert abs(u.start_sample / VAD_RATE - (offset + first)) < 0.1
        assert abs(u.end_sample / VAD_RATE - (offset + last)) < 0.15
    assert segment(np.concatenate([second, noise, second])) == []  # silence and hiss only: no turn


def test_long_speech_is_cut_and_a_click_is_not_a_question(question):
    utterances = segment(np.concatenate([question, question]), VadConfig(max_speech_s=1.5))
    assert utterances[0].cut and abs(len(utterances[0].audio) / VAD_RATE - 1.5 - 0.2) < 0.1  # pre-roll included
    click = np.zeros(VAD_RATE, np.float32)
    click[8000:8400] = np.sin(np.arange(400) * 0.3)  # 25 ms
    assert segment(click) == []


def test_the_listener_hears_the_question_in_words(question):
    silence = np.zeros(VAD_RATE // 2, np.float32)
    microphone = ArrayMicrophone(np.concatenate([silence, question, silence, silence]))  # in real time

    async def listen():
        return [line async for line in Listener(microphone).lines()]

    (heard,) = asyncio.run(listen())
    words = heard.text.lower().replace("?", "").split()
    assert {"weather", "paris", "tomorrow"} <= set(words)
    assert heard.speech_start_ns < heard.speech_end_ns <= heard.transcript_ready_ns
    assert abs((heard.speech_end_ns - heard.speech_start_ns) / 1e9 - len(question) / VAD_RATE) < 0.4


def test_a_guess_is_offered_early_in_the_pause_and_equals_the_final_utterance(question):
    segmenter = SpeechSegmenter()
    stream = np.concatenate([np.zeros(VAD_RATE // 2, np.float32), question, np.zeros(VAD_RATE, np.float32)])
    guesses, finals, guessed_at = [], [], None
    for i in range(0, len(stream), 512):
        finals += segmenter.push(stream[i : i + 512])
        guess = segmenter.guess()
        if guess is not None:
            guesses.append(guess)
            guessed_at = segmenter.samples  # the stream position of the latest guess
    (final,) = finals
    last = guesses[-1]  # earlier guesses came at pauses inside the question
    assert (last.start_sample, last.end_sample) == (final.start_sample, final.end_sample)
    assert np.array_equal(last.audio, final.audio)
    assert 0 < guessed_at - final.end_sample < 0.3 * VAD_RATE  # well before the 600 ms that confirm the end
