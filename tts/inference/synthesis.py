"""Word-by-word synthesis core, one object per synthesis unit (a sentence or a long clause of a reply;
`docs/streaming_engine.md`).

`UtteranceSynthesizer` is a plain state machine over words: `push_word`, `end`, and `step()`, which decodes as
far as the words received so far allow and returns the chunks of codec frames of every word it completed.
`steps()` is the same work as a generator that yields each decoder step it needs (`StepRequest`) and takes its
`StepOutput` back, so that a driver of many utterances can run their steps as one batch
(`tts/inference/batching.py`); `step()` runs the steps itself, one at a time. Words pushed are encoded at the next
step, or before it by `encode_units`, which encodes the words of many units in one pass (a stream's schedule yields
it as an `EncodeRequest`).
Generation for word n starts once word n+k has arrived (or the text has ended); word n is complete when the
newest step's cross-attention peak moves past it, or at the per-word frame cap; EOS is allowed only while the
last word is being decoded. The async front end and audio output build on this.
"""
from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from audio_io.errors import UserError
from tts.codec.base import Codec, held_back_frames
from tts.codec.load import load_codec
from tts.frontend.g2p import G2P, SymbolTable
from tts.frontend.text import SPOKEN_PUNCTUATION, normalize_text
from tts.model.incremental import DecoderState, IncrementalEncoder, StepOutput, add_slots_many, decode_step, encode_many
from tts.model.s5tts import S5TTS
from tts.model.sampling import mask_special_codes, sample_codes


MAX_WORD_SECONDS = 2.5  # the longest a single word may last (a runaway guard, whatever the codec's frame rate)


@dataclass
class SynthesisConfig:
    # sampling, measured on 30 unseen replies (Whisper WER / Distill-MOS, same seeds): top-k 20 at temperature 0.5
    # 3.19 / 2.62, top-k 80 3.48 / 2.58; temperature 0.3 4.35 / 2.67, 0.85 4.35 / 2.51 (a word is ~0.3 WER points)
    top_k: int = 20
    temperature: float = 0.5
    max_frames_per_word: int = 0  # 0: MAX_WORD_SECONDS of frames at the codec's rate
    max_seconds_per_phoneme: float = 0.25  # runaway guard scaled to the word: cap = 0.2 s + this x its phonemes
    min_frames_per_word: int = 1
    min_seconds_per_phoneme: float = 0.04  # a word may not end (attention moving on, or EOS) sooner than this
    seed: int | None = None
    # classifier-free guidance: logits = unconditional + cfg_scale x (conditional - unconditional), both rows in one
    # decoder pass; 1.0 is off (one row). Only a model trained with cfg_dropout has the unconditional row; others
    # ignore it. Measured (40 unseen replies): WER 3.25 at 1.0, 2.16 at 2.0; but the second row makes
    # a step slower (rtf +16 %) and the first sound after word 3 55-75 ms instead of 43-48: off by default.
    cfg_scale: float = 1.0
    trace_attention: bool = False  # keep every step's cross-attention (`UtteranceSynthesizer.attention_trace`): pictures


@dataclass
class StepRequest:
    """One decoder step an utterance needs: `decode_step(state, codes, words)`."""
    state: DecoderState
    codes: torch.Tensor  # (K, 1) the frame fed in
    words: torch.Tensor  # (1,) the word it is generated for


@dataclass
class RenderRequest:
    """One render a stream needs: `stream.push(codes, stretch)` (a driver of many streams renders several in one
    pass: `tts.codec.mel_codec.render_many`), or with `final` the stream's last audio (`stream.flush()`)."""
    stream: object  # the stream's codec decoder (`StreamingMelDecoder`, or any codec's streaming decoder)
    codes: torch.Tensor | None  # (K, n) the frames to render (None with `final`)
    stretch: float = 1.0
    final: bool = False
    overlap: bool = False  # the stream may decode on while this renders: a driver that renders on another thread
    # sends back a `PendingRender` at once instead of the audio

    def run(self) -> np.ndarray:
        if self.final:
            return self.stream.flush()
        return self.stream.push(self.codes, self.stretch) if self.stretch != 1.0 else self.stream.push(self.codes)


@dataclass
class EncodeRequest:
    """Words that synthesis units took and have not encoded yet: `encode_units(units)` (a driver of many streams
    encodes the words of several streams' units in one pass)."""
    units: list["UtteranceSynthesizer"]

    def run(self) -> None:
        encode_units(self.units)


@dataclass(eq=False)  # compared and hashed by identity
class PendingRender:
    """An overlapping render on another thread (`RenderRequest.overlap`): `done` once its audio, or the error it
    raised, is back. Yielded by the stream, it asks to wait for that and is sent the audio."""
    audio: np.ndarray | BaseException | None = None
    done: bool = False


Result = TypeVar("Result")
Steps = Generator[StepRequest | RenderRequest | EncodeRequest | PendingRender, StepOutput | np.ndarray | PendingRender | None,
                  Result]  # yields the work it needs (decoder steps, renders, encodes), is sent their outputs


def run_steps(work: "Steps[Result]") -> Result:
    """Drive a generator of decoder steps (and renders) alone: each runs when asked; returns what the generator
    returns."""
    try:
        request = next(work)
        while True:
            output = request.run() if isinstance(request, (RenderRequest, EncodeRequest)) else \
                decode_step(request.state, request.codes, request.words)
            request = work.send(output)
    except StopIteration as stop:
        return stop.value


@dataclass
class WordChunk:
    word_index: int  # 1-based
    word: str
    codes: torch.Tensor  # (K, n) frames generated for this word
    capped: bool = False  # ended by the frame cap instead of the attention moving on


@dataclass
class VoicePrompt:
    """Reference audio of the target voice: its transcript's phoneme ids per word, its codec frames, and the word
    of every frame (from the auxiliary attention's monotonic alignment)."""
    words: list[list[int]]
    codes: torch.Tensor  # (K, S)
    frame_words: torch.Tensor  # (S,) 1-based

    @classmethod
    def from_codes(cls, bundle: "TTSBundle", text: str, codes: torch.Tensor) -> "VoicePrompt":
        from tts.model.batch import Example, collate

        _, words = bundle.g2p.encode_text(text)
        if not words or codes.shape[1] == 0:
            raise UserError("a voice prompt needs a transcript with words and some audio")
        batch = collate([Example(words, codes.numpy(), None)])
        with torch.no_grad():
            _, _, frame_words = bundle.model.align(batch)
        return cls(words, codes.long(), frame_words[0].clamp(1, len(words)))

    @classmethod
    def from_audio(cls, bundle: "TTSBundle", text: str, audio) -> "VoicePrompt":
        return cls.from_codes(bundle, text, bundle.codec.encode(audio))


class TTSBundle:
    """Everything one voice needs, loaded once per process: model, symbols, G2P, codec."""

    def __init__(self, model: S5TTS, symbols: SymbolTable, codec: Codec, g2p: G2P | None = None):
        self.model = model.eval()
        self.symbols = symbols
        self.codec = codec
        self.g2p = g2p or G2P(symbols=symbols)
        if model.config.codebook_size != codec.codebook_size or model.config.num_codebooks != codec.num_codebooks:
            raise UserError("model and codec disagree on codebooks")

    def with_vocoder(self, name: str) -> "TTSBundle":
        """The same voice (model, symbols, G2P and codec weights shared, read-only) voiced by another vocoder:
        "universal" (HiFi-GAN V1) or a folder."""
        from tts.codec.mel_codec import MelCodec

        if not isinstance(self.codec, MelCodec):
            raise UserError("another vocoder needs the mel codec")
        codec = MelCodec(self.codec.model)
        codec.use_vocoder(name)
        return TTSBundle(self.model, self.symbols, codec, self.g2p)

    @classmethod
    def load(cls, model_dir: Path | str, codec_dir: Path | str | None = None) -> "TTSBundle":
        from tts.inference.export import load_exported

        model, symbols, meta = load_exported(Path(model_dir))
        return cls(model, symbols, load_codec(codec_dir or meta.get("train", {}).get("codec_dir")))

    def warm_up(self, threads: int) -> None:
        """A throwaway utterance, and codes through a streaming decoder in every push length it runs
        (`PUSH_LENGTHS`), first and steady: the CPU library compiles a kernel per convolution, input shape and
        thread count, and a kernel first met mid-reply is a render spike that can drain the player. So this runs
        with the torch thread count the renders will run with (`threads`: the chat's worker thread, the server's
        worker). Without it the first turn of `s5 bench e2e` ran dry 3 times in its first 0.2 s."""
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            synth = UtteranceSynthesizer(self, SynthesisConfig(seed=0, max_frames_per_word=6))
            synth.push_words(["Hello", "there,", "my"])
            synth.push_words(["friend."])
            synth.end()
            synth.step()
            held_back_frames(self.codec)  # measured once per codec: the first turn's synthesizer asks for it
            stream = self.codec.streaming_decoder()
            lengths = getattr(stream, "PUSH_LENGTHS", tuple(range(1, WARM_UP_CHUNKS + 1)))
            for n in lengths:
                codes = torch.zeros(self.codec.num_codebooks, n, dtype=torch.long)
                stream = self.codec.streaming_decoder()
                for _ in range(3):  # the first push and the steady ones differ in shape
                    stream.push(codes)
                stream.flush()
        finally:
            torch.set_num_threads(previous)

    def time_decoder_step(self, steps: int = 6) -> float:
        """Seconds a decoder step takes here, on one thread with the other core busy (`BusyNeighbour`, as an LLM
        beside the voice): what `auto` weighs a vocoder's renders against (`tts/codec/vocoder_choice.py`)."""
        import time

        from tts.codec.vocoder_choice import BusyNeighbour

        synth = UtteranceSynthesizer(self, SynthesisConfig(seed=0, max_frames_per_word=12))
        synth.push_words(["Hello", "there,", "my", "good", "friend."])
        synth.end()
        previous = torch.get_num_threads()
        torch.set_num_threads(1)
        took = []
        try:
            with BusyNeighbour():
                synth.step(max_frames=1)  # encoding and first-call allocations
                for _ in range(steps):
                    started = time.perf_counter()
                    synth.step(max_frames=1)
                    took.append(time.perf_counter() - started)
        finally:
            torch.set_num_threads(previous)
        return float(np.median(took))


WARM_UP_CHUNKS = 8  # codec frames: a codec without push lengths is warmed with chunks of 1 to this many frames


@dataclass
class AttentionStep:
    """One decoder step's cross-attention over the text tokens seen so far, for pictures (`s5 say --plot`)."""
    attention: np.ndarray  # (tokens,) mean over the alignment heads
    word_of_token: np.ndarray  # (tokens,) the word each token belongs to (1-based; a prompt's words first)
    word: int  # the word being generated
    visible_words: int  # words the step may attend to (s5: up to the word being spoken + k): the window's end


class UtteranceSynthesizer:
    def __init__(self, bundle: TTSBundle, config: SynthesisConfig | None = None, prompt: VoicePrompt | None = None):
        self.bundle = bundle
        self.config = config or SynthesisConfig()
        self.model = bundle.model
        self.k = self.model.config.lookahead_words
        self.encoder = IncrementalEncoder(self.model)
        guided = self.config.cfg_scale != 1.0 and self.model.null_memory is not None
        self.decoder = DecoderState(self.model, guided)
        self.words: list[str] = []
        self.ended = False
        self.current = 1  # word being generated
        self.current_frames: list[torch.Tensor] = []
        self.last_frame = torch.full((self.model.config.num_codebooks, 1), self.model.config.bos_id)
        self.finished = False
        self.frames: list[torch.Tensor] = []  # every generated frame (K,), in order: streaming reads a cursor
        self.generator = torch.Generator().manual_seed(self.config.seed) if self.config.seed is not None else None
        self.attention_trace: list[AttentionStep] | None = [] if self.config.trace_attention else None
        cap = self.config.max_frames_per_word or round(MAX_WORD_SECONDS * bundle.codec.frame_rate)
        self.max_frames_per_word = cap
        self.word_caps: list[int] = []  # frame cap of every word (the smaller of the two guards)
        self.word_minimums: list[int] = []  # frames every word gets at least
        # a voice prompt's words come first in the encoder and its frames prefix the decoder; our words are numbered
        # after them (word n of this utterance is word n + offset for the model)
        self.prompt = prompt
        self.offset = len(prompt.words) if prompt else 0
        if prompt:
            self.encoder.queue_words(prompt.words)

    # ---- input -------------------------------------------------------------------------------------------
    def push_word(self, word: str) -> bool:
        """One spoken word (already normalised, punctuation attached). Returns False if it has no phonemes
        besides punctuation (nothing to say: it is skipped)."""
        return self.push_words([word])[0]

    def push_words(self, words: list[str]) -> list[bool]:
        """Words that arrived together, encoded in one pass (a number's many words cost one encoder call)."""
        if not words:
            return []
        if self.ended:
            raise RuntimeError("push_word after end()")
        symbols, rate = self.bundle.symbols.symbols, self.bundle.codec.frame_rate
        kept, spoken = [], []
        for word, ids in zip(words, self.bundle.g2p.encode_words(words)):
            phonemes = sum(symbols[i] not in SPOKEN_PUNCTUATION for i in ids)
            spoken.append(phonemes > 0)
            if not phonemes:
                continue  # nothing but punctuation (or nothing at all): no sound to make
            kept.append(ids)
            self.words.append(word)
            by_length = round((0.2 + self.config.max_seconds_per_phoneme * phonemes) * rate) if self.config.max_seconds_per_phoneme else self.max_frames_per_word
            self.word_caps.append(max(1, min(self.max_frames_per_word, by_length)))
            minimum = max(self.config.min_frames_per_word, round(self.config.min_seconds_per_phoneme * phonemes * rate))
            self.word_minimums.append(min(minimum, self.word_caps[-1]))
        self.encoder.queue_words(kept)  # encoded by `encode_units` (a stream's schedule), or at the next step
        return spoken

    def end(self) -> None:
        self.ended = True
        self.encoder.queue_end()
        if not self.words:
            self.finished = True

    # ---- generation ----------------------------------------------------------------------------------------
    def ready(self) -> bool:
        """May the current word be generated now?"""
        if self.finished or not self.words:
            return False
        if self.ended:
            return True
        return self.k is not None and len(self.words) >= self.current + self.k

    def step(self, max_frames: int | None = None, stop_at_word: bool = False) -> list[WordChunk]:
        """Decode frames while allowed (at most max_frames, and only up to the next completed word with
        stop_at_word); return the chunks of the words completed."""
        return run_steps(self.steps(max_frames, stop_at_word))

    @torch.inference_mode()
    def steps(self, max_frames: int | None = None, stop_at_word: bool = False) -> Steps[list[WordChunk]]:
        """`step()` as a generator of its decoder steps."""
        chunks: list[WordChunk] = []
        steps = 0
        while self.ready() and (max_frames is None or steps < max_frames):
            chunk = yield from self._advance_one_frame()
            steps += 1
            if chunk is not None:
                chunks.append(chunk)
                if stop_at_word:
                    break
        return chunks

    def _prefill_prompt(self) -> None:
        """Feed the prompt's frames through the decoder (one pass, KV cache kept) before our first frame."""
        prompt, self.prompt = self.prompt, None
        inputs = torch.cat([self.last_frame, prompt.codes[:, :-1]], dim=1)  # BOS, p_0 .. p_{S-2}
        decode_step(self.decoder, inputs, prompt.frame_words)
        self.last_frame = prompt.codes[:, -1:]

    def _advance_one_frame(self) -> Steps[WordChunk | None]:
        c = self.model.config
        self.decoder.add_slots(self.encoder.read_slots())
        if self.prompt is not None:
            self._prefill_prompt()
        n, last_word = self.current, len(self.words)
        out = yield StepRequest(self.decoder, self.last_frame, torch.tensor([n + self.offset]))
        is_last = self.ended and n == last_word
        long_enough = len(self.current_frames) >= self.word_minimums[n - 1]
        logits = out.logits[0]
        if out.unconditional_logits is not None:
            unconditional = out.unconditional_logits[0]
            logits = unconditional + self.config.cfg_scale * (logits - unconditional)
        allow_eos = is_last and long_enough
        logits = mask_special_codes(logits, c.codebook_size, allow_eos)
        codes = sample_codes(logits, self.config.top_k, self.config.temperature, self.generator)  # (K,)
        if allow_eos:
            if int(codes[0]) == c.eos_id:
                return self._finish_word(capped=False, final=True)
            codes = torch.where(codes >= c.codebook_size, torch.zeros_like(codes), codes)  # EOS in other codebooks
        self.current_frames.append(codes)
        self.frames.append(codes)
        self.last_frame = codes[:, None]
        attention = out.token_attention[0]
        peak_word = self.encoder.word_ids[int(attention.argmax())]
        if self.attention_trace is not None:
            visible = len(self.words) if self.k is None else min(len(self.words), n + self.k)  # M_dec's horizon
            word_of_token = np.asarray(self.encoder.word_ids[: len(attention)])
            self.attention_trace.append(AttentionStep(attention.float().numpy().copy(), word_of_token,
                                                      n + self.offset, visible + self.offset))
        frames = len(self.current_frames)
        if frames >= self.word_caps[n - 1]:
            return self._finish_word(capped=True, final=is_last)
        if peak_word > n + self.offset and frames >= self.word_minimums[n - 1]:
            return self._finish_word(capped=False, final=is_last and peak_word > last_word + self.offset and frames > 1)
        return None

    def _finish_word(self, capped: bool, final: bool) -> WordChunk:
        codes = torch.stack(self.current_frames, dim=1) if self.current_frames else torch.zeros(self.model.config.num_codebooks, 0, dtype=torch.long)
        chunk = WordChunk(self.current, self.words[self.current - 1], codes, capped)
        self.current_frames = []
        if final or self.current >= len(self.words) and self.ended:
            self.finished = True
        else:
            self.current += 1
        return chunk


def encode_units(units: list[UtteranceSynthesizer]) -> None:
    """Every unit's words pushed and not yet encoded, through the encoder and into the decoder's memory slots: the
    units of one model in one pass (`tts/model/incremental.encode_many`, `add_slots_many`)."""
    encode_many([unit.encoder for unit in units])
    add_slots_many([unit.decoder for unit in units], [unit.encoder.read_slots() for unit in units])


def synthesize_text(bundle: TTSBundle, text: str, config: SynthesisConfig | None = None) -> tuple[torch.Tensor, list[WordChunk]]:
    """Whole text at once (words pushed, then end()) -> all codes (K, T) and the word chunks."""
    synth = UtteranceSynthesizer(bundle, config)
    for word in normalize_text(text):
        synth.push_word(word)
    synth.end()
    chunks = synth.step()
    codes = torch.cat([ch.codes for ch in chunks], dim=1) if chunks else torch.zeros(bundle.codec.num_codebooks, 0, dtype=torch.long)
    return codes, chunks
