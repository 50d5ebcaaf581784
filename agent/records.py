"""One latency record per turn (`docs/architecture.md`, section 2), JSONL on disk and a one-line timeline in the terminal."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rich.text import Text

from audio_io.sinks import PlaybackStats
from tts.inference.pipeline import gap_report
from tts.inference.stream_parts import UtteranceTimes

STAMPS = ("request_sent", "first_token", "first_word", "word_k1_arrived", "first_codec_frame", "first_audio_chunk",
          "first_audible_sample", "last_token", "last_audio")
EXTRA_STAMPS = ("user_speech_start", "user_speech_end", "transcript_ready", "interrupted_at", "silenced")
# the stamps the turn's synthesizer and player write in their own records: name -> (part, attribute)
STAGE_STAMPS = {
    "first_word": ("synthesis", "first_word_ns"),
    "word_k1_arrived": ("synthesis", "start_allowed_ns"),  # s5: word k+1; t5: the reply's end; sentence: its first
    "first_codec_frame": ("synthesis", "first_codec_frame_ns"),
    "first_audio_chunk": ("synthesis", "first_chunk_ns"),
    "last_audio": ("synthesis", "last_chunk_ns"),
    "first_audible_sample": ("playback", "first_audible_ns"),
}


@dataclass
class TurnRecord:
    """A turn's latency record. The agent stamps what it sees (the request, the LLM's tokens, the user's speech, an
    interruption); the turn's synthesizer and player stamp theirs in their own records, held here as they are
    (`synthesis`, `playback`), so every event is written once, by the stage that observes it."""
    turn: int
    tts_mode: str
    llm: str
    user: str
    reply: str = ""
    # perf_counter_ns stamps (None: never happened)
    request_sent: int | None = None
    first_token: int | None = None
    last_token: int | None = None
    user_speech_start: int | None = None  # spoken input: the VAD's start and end of the user's speech
    user_speech_end: int | None = None
    transcript_ready: int | None = None  # ... and when Whisper's transcript was ready
    interrupted_at: int | None = None  # barge-in: the interrupting line (or Ctrl-C) arrived
    silenced: int | None = None  # ... and the sink's output went quiet (its device latency included)
    synthesis: UtteranceTimes = field(default_factory=UtteranceTimes)  # the engine's: words in, frames, chunks out
    playback: PlaybackStats = field(default_factory=PlaybackStats)  # the player's: first audible sample, underruns
    cancelled: bool = False
    words_written: int = 0  # words the LLM's reply gave the voice
    words_heard: int = 0  # of those, the words whose sound had begun to play (all, unless interrupted)
    started_on_guess: bool = False  # spoken input: the turn began on the VAD's guess, held silent until the end was sure
    retracted: bool = False  # ... and the user went on speaking: it was dropped unheard (not in the history)
    error: str | None = None
    llm_stats: dict = field(default_factory=dict)

    def stamp(self, name: str) -> int | None:
        """A stamp by its JSON name: the agent's own field, or the stage's record that wrote it (STAGE_STAMPS)."""
        if name in STAGE_STAMPS:
            part, attribute = STAGE_STAMPS[name]
            return getattr(getattr(self, part), attribute)
        return getattr(self, name)

    @property
    def frames_per_word(self) -> float | None:
        return round(self.synthesis.frames / self.synthesis.words, 2) if self.synthesis.words else None

    @property
    def rtf(self) -> float | None:
        return round(self.synthesis.compute_ns / 1e9 / self.synthesis.audio_s, 3) if self.synthesis.audio_s else None

    @property
    def paced_ms(self) -> float:
        """Audio added by slowing down while the LLM was behind the voice."""
        return round(self.synthesis.paced_s * 1000, 1)

    @property
    def opening_hold_ms(self) -> float:
        """A short first word waited this long for the next word's text (no gap after it)."""
        return round(self.synthesis.opening_hold_ms, 1)

    @property
    def underruns(self) -> int:
        return self.playback.underruns

    @property
    def underrun_ms(self) -> float:
        return round(self.playback.underrun_ms, 1)

    @property
    def gaps(self) -> list[dict]:
        """Per underrun: at_s, ms, the words before and after it."""
        return gap_report(self.playback, self.synthesis)

    def ms_between(self, start: str, end: str) -> float | None:
        """Milliseconds from one stamp to another (None: either never happened)."""
        begin, until = self.stamp(start), self.stamp(end)
        return None if begin is None or until is None else round((until - begin) / 1e6, 1)

    def ms_after_request(self, stamp: str) -> float | None:
        return self.ms_between("request_sent", stamp)

    @property
    def e2e_ms(self) -> float | None:
        """First audible sample after the request: what the user waits for."""
        return self.ms_after_request("first_audible_sample")

    @property
    def e2e_minus_floor_ms(self) -> float | None:
        """First audible sample after synthesis was allowed to start (s5: word k+1 arrived; t5: the reply ended;
        sentence: the first sentence ended): what the engine adds to the LLM's own pace."""
        return self.ms_between("word_k1_arrived", "first_audible_sample")

    @property
    def voice_to_voice_ms(self) -> float | None:
        """Spoken input: from the end of the user's speech to the first audible sample of the answer."""
        return self.ms_between("user_speech_end", "first_audible_sample")

    @property
    def barge_in_ms(self) -> float | None:
        """From the interruption to silence at the sink."""
        return self.ms_between("interrupted_at", "silenced")

    @property
    def e2e_chunk_ms(self) -> float | None:
        """First audio chunk after the request (the paper's figure)."""
        return self.ms_after_request("first_audio_chunk")

    def to_json(self) -> dict:
        """One flat JSON object: every stamp (and ms after the request), the derived figures, no raw lists."""
        data = {name: getattr(self, name) for name in ("turn", "tts_mode", "llm", "user", "reply")}
        data |= {name: getattr(self.synthesis, name) for name in ("spoken_words", "frames", "audio_s")}
        data |= {stamp: self.stamp(stamp) for stamp in STAMPS + EXTRA_STAMPS}
        data |= {name: getattr(self, name) for name in (
            "underruns", "underrun_ms", "gaps", "paced_ms", "opening_hold_ms", "rtf", "frames_per_word", "cancelled",
            "words_written", "words_heard",
            "started_on_guess", "retracted", "error", "llm_stats", "e2e_ms", "e2e_chunk_ms", "e2e_minus_floor_ms",
            "barge_in_ms", "voice_to_voice_ms")}
        data["ms"] = {stamp: self.ms_after_request(stamp) for stamp in STAMPS}
        return data

    def summary_line(self) -> str:
        def ms(value: float | None) -> str:
            return "-" if value is None else f"{value:.0f} ms"

        voice = [f"voice-to-voice {ms(self.voice_to_voice_ms)}"] if self.user_speech_end is not None else []
        parts = [f"turn {self.turn}", self.tts_mode, *voice, f"E2E {ms(self.e2e_ms)}", f"first chunk {ms(self.e2e_chunk_ms)}",
                 f"first token {ms(self.ms_after_request('first_token'))}", f"{self.synthesis.spoken_words} words",
                 f"{self.synthesis.audio_s:.1f} s audio", f"rtf {self.rtf:.2f}" if self.rtf is not None else "rtf -",
                 f"underruns {self.underruns}"]
        if self.paced_ms:
            parts.append(f"paced +{self.paced_ms:.0f} ms")
        if self.opening_hold_ms:
            parts.append(f"first word held {self.opening_hold_ms:.0f} ms")
        if self.cancelled:
            parts.append("interrupted" + (f", silent {self.barge_in_ms:.0f} ms later" if self.barge_in_ms is not None else ""))
        if self.error:
            parts.append(f"error: {self.error}")
        return " · ".join(parts)

    def timeline(self, width: int = 60) -> Text:
        """A bar from the request to the last audio with a letter per stamp: T first token, W first word,
        S synthesis may start, C first chunk, A first audible, E last token, L last audio."""
        marks = {"first_token": "T", "first_word": "W", "word_k1_arrived": "S", "first_audio_chunk": "C",
                 "first_audible_sample": "A", "last_token": "E", "last_audio": "L"}
        times = {k: self.ms_after_request(k) for k in marks}
        end = max([t for t in times.values() if t is not None] or [1.0]) or 1.0
        bar = ["─"] * (width + 1)
        styles = {"A": "bold green", "C": "green", "T": "cyan", "W": "cyan", "S": "yellow", "E": "magenta", "L": "magenta"}
        text = Text("0 ")
        for stamp, letter in marks.items():
            if times[stamp] is not None:
                bar[round(times[stamp] / end * width)] = letter
        for ch in bar:
            text.append(ch, style=styles.get(ch, "dim"))
        text.append(f" {end:.0f} ms")
        return text


def append_jsonl(path: Path, record: TurnRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
