"""Where speech starts and ends in a microphone stream: the Silero VAD (its ONNX model from PyPI's `silero-vad`,
run here with onnxruntime) and a per-stream segmenter that turns 32 ms blocks into utterances.

A block's speech probability above `start_threshold` opens an utterance (with `pre_roll_ms` of audio before it,
so soft onsets reach the ASR); `end_silence_ms` below `end_threshold` closes it. Utterances shorter than
`min_speech_ms` are dropped (a cough, a click); one longer than `max_speech_s` is cut there and flagged.
"""
from __future__ import annotations

import importlib.util
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from audio_io.errors import UserError

VAD_RATE = 16000
BLOCK = 512  # samples per VAD step at 16 kHz (32 ms): the model's own window
CONTEXT = 64  # samples of the previous block the model sees with each new one


@dataclass
class VadConfig:
    start_threshold: float = 0.5
    end_threshold: float = 0.35
    end_silence_ms: float = 600.0  # a pause this long ends the utterance (a breath inside a sentence is shorter)
    guess_silence_ms: float = 160.0  # after this much pause the utterance so far is offered as a guess (`guess()`),
    # so the ASR can run while the end is being confirmed
    pre_roll_ms: float = 200.0
    min_speech_ms: float = 250.0
    max_speech_s: float = 20.0


@dataclass
class Utterance:
    audio: np.ndarray  # float32 at VAD_RATE, pre-roll included
    start_sample: int  # stream sample where speech started (after the pre-roll)
    end_sample: int  # stream sample where speech ended (the trailing silence not counted)
    cut: bool = False  # ended by max_speech_s, not by a pause


@lru_cache(maxsize=1)
def _session():
    spec = importlib.util.find_spec("silero_vad")  # its data only: the package's own code imports torchaudio
    if spec is None or not spec.submodule_search_locations:
        raise UserError("spoken input needs the Silero VAD model: run ./setup.sh (pip install --no-deps silero-vad)")
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = options.intra_op_num_threads = 1
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.onnx"
    return onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


class SpeechProbability:
    """Per stream: the Silero model's recurrent state and context; `__call__(block)` -> P(speech) of 512 samples."""

    def __init__(self):
        self.session = _session()
        self.state = np.zeros((2, 1, 128), np.float32)
        self.context = np.zeros((1, CONTEXT), np.float32)

    def __call__(self, block: np.ndarray) -> float:
        x = np.concatenate([self.context, block.reshape(1, BLOCK).astype(np.float32)], axis=1)
        out, self.state = self.session.run(None, {"input": x, "state": self.state, "sr": np.array(VAD_RATE, np.int64)})
        self.context = x[:, -CONTEXT:]
        return float(out[0, 0])


class SpeechSegmenter:
    """Per stream: 16 kHz audio in (any block size), finished utterances out."""

    def __init__(self, config: VadConfig | None = None):
        self.config = config or VadConfig()
        self.probability = SpeechProbability()
        self.pending = np.zeros(0, np.float32)  # samples not yet a whole VAD block
        self.samples = 0  # stream samples consumed into blocks
        self.pre_roll: deque[np.ndarray] = deque(maxlen=max(1, round(self.config.pre_roll_ms / 1000 * VAD_RATE / BLOCK)))
        self.speech: list[np.ndarray] | None = None  # the open utterance's blocks
        self.start = 0
        self.last_voiced = 0
        self.silent_blocks = 0
        self.guessed = False  # the open utterance has been offered as a guess since its last voiced block
        self._guess: Utterance | None = None

    @property
    def in_speech(self) -> bool:
        return self.speech is not None

    def push(self, audio: np.ndarray) -> list[Utterance]:
        self.pending = np.concatenate([self.pending, np.asarray(audio, np.float32).reshape(-1)])
        done = []
        while len(self.pending) >= BLOCK:
            block, self.pending = self.pending[:BLOCK], self.pending[BLOCK:]
            utterance = self._block(block)
            if utterance is not None:
                done.append(utterance)
        return done

    def guess(self) -> Utterance | None:
        """The open utterance as it would end if the pause now going on is its end (once per pause), else None.
        If it does end there, the final `Utterance` has the same start and end."""
        guess, self._guess = self._guess, None
        return guess

    def flush(self) -> list[Utterance]:
        """The stream ended: an open utterance ends here."""
        return [u for u in [self._close(cut=False)] if u is not None] if self.in_speech else []

    def _block(self, block: np.ndarray) -> Utterance | None:
        c, p = self.config, self.probability(block)
        at = self.samples
        self.samples += BLOCK
        if self.speech is None:
            if p >= c.start_threshold:
                self.speech, self.start, self.last_voiced, self.silent_blocks = [*self.pre_roll, block], at, at + BLOCK, 0
                self.pre_roll.clear()
            else:
                self.pre_roll.append(block)
            return None
        self.speech.append(block)
        if p >= c.end_threshold:
            self.last_voiced, self.silent_blocks, self.guessed = at + BLOCK, 0, False
        else:
            self.silent_blocks += 1
            if not self.guessed and self.silent_blocks * BLOCK >= c.guess_silence_ms / 1000 * VAD_RATE:
                self.guessed = True
                self._guess = self._utterance(list(self.speech), self.last_voiced, cut=False)
        if self.silent_blocks * BLOCK >= c.end_silence_ms / 1000 * VAD_RATE:
            return self._close(cut=False)
        if self.samples - self.start >= c.max_speech_s * VAD_RATE:
            return self._close(cut=True)
        return None

    def _close(self, cut: bool) -> Utterance | None:
        blocks, self.speech, self._guess = self.speech, None, None
        return self._utterance(blocks, self.samples if cut else self.last_voiced, cut)

    def _utterance(self, blocks: list[np.ndarray], end: int, cut: bool) -> Utterance | None:
        if end - self.start < self.config.min_speech_ms / 1000 * VAD_RATE:
            return None  # too short to be a question
        audio = np.concatenate(blocks)
        keep = len(audio) - (self.samples - end)  # drop the trailing silence
        return Utterance(audio[:keep], self.start, end, cut)
