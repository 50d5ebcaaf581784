"""`s5 bench codec`: round-trip quality and decoding speed of a codec on unseen sentences of the voice the TTS
speaks: a corpus split (default: the test split's Piper utterances) and/or sentences spoken on the spot."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from audio_io.errors import UserError
from tts.codec.base import Codec
from tts.data.corpus import read_manifest
from tts.data.features import load_audio
from tts.data.voices import SAMPLE_RATE, VOICES
from tts.eval.metrics import distillmos, dnsmos, error_rates, speaker_similarity, transcribe

Clip = tuple[str, np.ndarray]  # (text, float32 audio at 22.05 kHz)


def corpus_summary(corpus: Path) -> tuple[int, float]:
    speakers, seconds = set(), 0.0
    for name in ("train", "val", "test", "zeroshot"):
        path = corpus / f"{name}.jsonl"
        if path.exists():
            for e in read_manifest(path):
                speakers.add(e.speaker)
                seconds += e.duration
    return len(speakers), seconds / 3600


def manifest_clips(manifest: Path, limit: int, speaker: str | None = "piper_joe") -> list[Clip]:
    """Up to `limit` utterances of `speaker` (None: every voice, round-robin) in a stable order."""
    entries = sorted((e for e in read_manifest(manifest) if speaker is None or e.speaker == speaker), key=lambda e: e.audio_filepath)
    if not entries:
        raise UserError(f"no utterances of {speaker or 'any voice'} in {manifest}")
    by_speaker: dict[str, list] = {}
    for e in entries:
        by_speaker.setdefault(e.speaker, []).append(e)
    picked: list = []
    while len(picked) < limit and any(by_speaker.values()):
        for queue in by_speaker.values():
            if queue and len(picked) < limit:
                picked.append(queue.pop(0))
    return [(e.text, load_audio(manifest.parent, e.audio_filepath)) for e in picked]


def voice_clips(sentences: list[str], voice: str = "piper_joe") -> list[Clip]:
    """The sentences spoken by one of the offline voices."""
    return [(text, VOICES[voice].synthesize(text).audio) for text in sentences]


def stream_decode(codec: Codec, codes, chunk: int) -> np.ndarray:
    decoder = codec.streaming_decoder()
    parts = [decoder.push(codes[:, i : i + chunk]) for i in range(0, codes.shape[1], chunk)]
    return np.concatenate(parts + [decoder.flush()])


def run_codec_bench(codec: Codec, clips: list[Clip], progress=None, quality: bool = True) -> dict:
    """Whisper WER/CER of the originals and their round trips, similarity, Distill-MOS, DNSMOS, and decoding speed (codes to
    audio, vocoder included) offline and streamed about a word of codes per push. All decoding is timed first, in
    a pass of its own (after a warm-up that loads the vocoder), so that the ASR's and DNSMOS's thread pools cannot
    slow it."""
    if not clips:
        raise UserError("no clips to measure the codec on")
    chunk = max(1, round(codec.frame_rate * 0.3))  # about one word of codes per streaming push
    task = progress.add_task("codec round trips", total=(1 + quality) * len(clips)) if progress else None
    codec.decode(codec.encode(clips[0][1])[:, :2])  # warm-up: lazy loads and first-call allocations
    roundtrips = []
    audio_seconds = decode_seconds = stream_seconds = 0.0
    for text, audio in clips:
        codes = codec.encode(audio)
        start = time.perf_counter()
        roundtrip = codec.decode(codes)
        decode_seconds += time.perf_counter() - start
        start = time.perf_counter()
        streamed = stream_decode(codec, codes, chunk)
        stream_seconds += time.perf_counter() - start
        assert len(streamed) == len(roundtrip)
        audio_seconds += len(roundtrip) / SAMPLE_RATE
        roundtrips.append(roundtrip[: len(audio)])
        if progress:
            progress.advance(task)
    speed = {
        "frame_rate": round(codec.frame_rate, 2),
        "decode_rtf": round(decode_seconds / audio_seconds, 4),
        "stream_decode_rtf": round(stream_seconds / audio_seconds, 4),
        "stream_chunk_codes": chunk,
        "bitrate_bps": round(codec.frame_rate * codec.num_codebooks * np.log2(codec.codebook_size)),
        "n": len(clips),
    }
    if not quality:
        return speed
    hyp_orig, hyp_rt, sims, mos_orig, mos_rt, dmos_orig, dmos_rt = [], [], [], [], [], [], []
    for (text, audio), roundtrip in zip(clips, roundtrips):
        hyp_orig.append(transcribe(audio, SAMPLE_RATE))
        hyp_rt.append(transcribe(roundtrip, SAMPLE_RATE))
        sims.append(speaker_similarity(audio, roundtrip, SAMPLE_RATE))
        mos_orig.append(dnsmos(audio, SAMPLE_RATE))
        mos_rt.append(dnsmos(roundtrip, SAMPLE_RATE))
        dmos_orig.append(distillmos(audio, SAMPLE_RATE))
        dmos_rt.append(distillmos(roundtrip, SAMPLE_RATE))
        if progress:
            progress.advance(task)
    refs = [text for text, _ in clips]
    wer_orig, cer_orig = error_rates(refs, hyp_orig)
    wer_rt, cer_rt = error_rates(refs, hyp_rt)
    return {
        **speed,
        "wer_original": round(wer_orig, 2),
        "wer_roundtrip": round(wer_rt, 2),
        "cer_original": round(cer_orig, 2),
        "cer_roundtrip": round(cer_rt, 2),
        "speaker_similarity": round(float(np.mean(sims)), 3),
        "dnsmos_original": round(float(np.mean(mos_orig)), 3),
        "dnsmos_roundtrip": round(float(np.mean(mos_rt)), 3),
        "distillmos_original": round(float(np.mean(dmos_orig)), 3),
        "distillmos_roundtrip": round(float(np.mean(dmos_rt)), 3),
    }


def render_costs(codec, push_lengths: tuple[int, ...] = (1, 4, 16), stream_counts: tuple[int, ...] = (1, 4, 8),
                 frames: int = 256, seed: int = 0) -> dict:
    """What a render costs: CPU seconds of this thread (run it with one torch thread) per second of audio, for
    `frames` random codes a stream rendered through the codec's streaming decoder and vocoder in pushes of each
    length, one stream alone or several streams' pushes in one pass (`tts/codec/mel_codec.render_many`, as the
    server's worker renders). The first two pushes of each run are warm-up, not timed."""
    import torch

    from tts.codec.mel_codec import render_many

    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, codec.codebook_size, (codec.num_codebooks, frames), generator=generator)
    rows = []
    for push in push_lengths:
        row = {"push_frames": push}
        for n in stream_counts:
            streams = [codec.streaming_decoder() for _ in range(n)]
            timed_frames, cpu_s = 0, 0.0
            for i, start in enumerate(range(0, frames - push + 1, push)):
                piece = codes[:, start : start + push]
                started = time.thread_time()
                render_many(streams, [piece] * n, [1.0] * n)
                if i >= 2:
                    cpu_s += time.thread_time() - started
                    timed_frames += push * n
            row[f"ms_per_audio_s_{n}_streams"] = round(1000 * cpu_s / (timed_frames / codec.frame_rate), 1) \
                if timed_frames else None
        rows.append(row)
    return {"frames_per_stream": frames, "rows": rows}
