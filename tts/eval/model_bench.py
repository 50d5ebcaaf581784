"""`s5 bench model`: parameter counts, training step time, cached vs naive decoding speed, and the encoder passes of
many streams' words each alone vs together, in one run."""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass

import torch
from rich.progress import Progress

from tts.model.batch import TEXT_BOS, TEXT_EOS, Batch
from tts.model.config import ModelConfig, load_model_config
from tts.model.incremental import DecoderState, IncrementalEncoder, decode_step, encode_many
from tts.model.s5tts import S5TTS, teacher_forcing


@dataclass
class ModelBenchConfig:
    config: str = "s5_default"
    train_batch: int = 16
    train_phonemes: int = 60
    train_frames: int = 250
    train_steps: int = 3  # timed, after one warm-up step
    decode_frames: int = 300
    words: int = 15
    streams: int = 16  # a server's burst of new requests...
    opening_words: int = 5  # ...each encoding its first few words (then a whole sentence's `words`)
    encode_repeats: int = 7  # the median of this many


def count_parameters(config: ModelConfig) -> int:
    with torch.device("meta"):
        return S5TTS(config).num_parameters()


def random_batch(config: ModelConfig, batch: int, phonemes: int, frames: int, words: int, seed: int = 0) -> Batch:
    """Random tokens with `words` words spread over `phonemes` tokens per row (BOS first, EOS its own last word)."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(3, config.phoneme_vocab_size, (batch, phonemes), generator=g)
    text[:, 0], text[:, -1] = TEXT_BOS, TEXT_EOS
    inner = (torch.arange(phonemes - 1) * words // (phonemes - 1) + 1).expand(batch, -1)
    text_words = torch.cat([inner, torch.full((batch, 1), words + 1)], dim=1)
    codes = torch.randint(0, config.codebook_size, (batch, config.num_codebooks, frames), generator=g)
    return Batch(text, text_words, torch.full((batch,), phonemes), codes, torch.full((batch,), frames))


def time_train_step(config: ModelConfig, bench: ModelBenchConfig, progress: Progress) -> float:
    model = S5TTS(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = random_batch(config, bench.train_batch, bench.train_phonemes, bench.train_frames, bench.words)
    task = progress.add_task("train steps", total=bench.train_steps + 1)
    times = []
    for _ in range(bench.train_steps + 1):
        start = time.perf_counter()
        loss = model(batch, prior_strength=1.0).losses.total
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        progress.advance(task)
    return sum(times[1:]) / bench.train_steps


@torch.no_grad()
def time_decoding(config: ModelConfig, bench: ModelBenchConfig, progress: Progress) -> tuple[float, float, float]:
    """ms per frame with the KV cache and with the naive full recomputation of the prefix, same frames, same run.
    Returns (cached_ms, naive_ms, max logit difference between the two)."""
    model = S5TTS(config).eval()
    batch = random_batch(config, 1, bench.train_phonemes, bench.decode_frames, bench.words, seed=1)
    S = bench.decode_frames
    inputs, _, _ = teacher_forcing(batch.codes, batch.code_lens, config.bos_id, config.eos_id)
    step_words = (torch.arange(S) * bench.words // S + 1)  # A(s) walks through the words
    words = batch.text_words[0]
    word_tokens = [batch.text[0, 1:-1][words[1:-1] == w].tolist() for w in range(1, bench.words + 1)]
    word_tokens[0] = batch.text[0, 1 : 1 + len(word_tokens[0])].tolist()

    task = progress.add_task("cached decoding", total=S)
    start = time.perf_counter()
    encoder, state = IncrementalEncoder(model), DecoderState(model)
    for w in word_tokens:
        encoder.push_word(w)
    encoder.end()
    state.add_slots(encoder.read_slots())
    cached_logits = []
    for s in range(S):
        cached_logits.append(decode_step(state, inputs[0, :, s : s + 1], step_words[s : s + 1]).logits[0])
        progress.advance(task)
    cached_ms = (time.perf_counter() - start) * 1000 / S

    task = progress.add_task("naive decoding", total=S)
    start = time.perf_counter()
    memory = model.memory_slots(model.encode(batch.text, batch.text_words), batch.text_words)
    naive_logits = []
    for s in range(S):
        naive_logits.append(model.decode(inputs[:, :, : s + 1], memory, step_words[None, : s + 1]).logits[0, -1])
        progress.advance(task)
    naive_ms = (time.perf_counter() - start) * 1000 / S
    diff = (torch.stack(cached_logits) - torch.stack(naive_logits)).abs().max().item()
    return cached_ms, naive_ms, diff


def time_encoding(config: ModelConfig, bench: ModelBenchConfig, progress: Progress) -> dict[str, float]:
    """ms for `streams` new encoders to encode their first words (`opening_words`, then all `words`), each alone
    (as a worker did before `encode_many`) and all in one pass, interleaved; medians of `encode_repeats`."""
    model = S5TTS(config).eval()
    words = [[int(t) for t in torch.randint(3, 40, (4,), generator=torch.Generator().manual_seed(i))]
             for i in range(bench.words)]
    timings: dict[str, list[float]] = {}
    task = progress.add_task("encoder passes", total=bench.encode_repeats * 4)
    for _ in range(bench.encode_repeats):
        for n_words in (bench.opening_words, bench.words):
            for together in (False, True):
                encoders = [IncrementalEncoder(model) for _ in range(bench.streams)]
                start = time.perf_counter()
                if together:
                    for encoder in encoders:
                        encoder.queue_words(words[:n_words])
                    encode_many(encoders)
                else:
                    for encoder in encoders:
                        encoder.push_words(words[:n_words])
                key = f"encode_{bench.streams}x{n_words}_words_ms_{'together' if together else 'alone'}"
                timings.setdefault(key, []).append((time.perf_counter() - start) * 1000)
                progress.advance(task)
    return {key: round(sorted(values)[len(values) // 2], 1) for key, values in timings.items()}


def run_model_bench(bench: ModelBenchConfig, progress: Progress) -> dict:
    default = load_model_config(bench.config)
    torch.manual_seed(0)
    train_s = time_train_step(default, bench, progress)
    cached_ms, naive_ms, diff = time_decoding(default, bench, progress)
    return {
        "params_paper": count_parameters(load_model_config("s5_paper")),
        "params_default": count_parameters(default),
        "config_default": bench.config,
        "train_step_s_default": round(train_s, 3),
        "train_shape": f"batch {bench.train_batch}, {bench.train_phonemes} phonemes x {bench.train_frames} frames",
        "ms_per_frame_cached": round(cached_ms, 3),
        "ms_per_frame_naive": round(naive_ms, 3),
        "cached_speedup": round(naive_ms / cached_ms, 2),
        "decode_frames": bench.decode_frames,
        "cached_vs_naive_max_abs_diff": diff,
        **time_encoding(default, bench, progress),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }
