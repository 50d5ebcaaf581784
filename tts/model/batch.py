"""What the model reads: the text specials, a padded `Batch` (and `Example` + `collate` that build one), and the
encoder's output as memory slots."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Phoneme-side specials; the symbol table (tts/g2p) puts real symbols after these.
TEXT_PAD, TEXT_BOS, TEXT_EOS = 0, 1, 2


@dataclass
class Batch:
    """One padded training batch. Word ids are 1-based per utterance, 0 on padding. BOS belongs to word 1; EOS is
    a word of its own (N+1), so removing words after n+k, or learning late that the text has ended, changes
    nothing word n can see."""
    text: torch.Tensor  # (B, T) phoneme ids, BOS first and EOS last in each row
    text_words: torch.Tensor  # (B, T) word index of every token
    text_lens: torch.Tensor  # (B,)
    codes: torch.Tensor  # (B, K, S) codec frames
    code_lens: torch.Tensor  # (B,)
    prompt_lens: torch.Tensor | None = None  # (B,) leading frames that are the reference prompt (no CE loss)
    frame_words: torch.Tensor | None = None  # (B, S) A(s) given from outside (e.g. Piper durations); rows of 0 = unknown


@dataclass
class Memory:
    """Encoder output as memory slots: one slot per (token, horizon version)."""
    states: torch.Tensor  # (B, L, C)
    words: torch.Tensor  # (B, L) word of the slot's token (0 = padding)
    versions: torch.Tensor  # (B, L) horizon version j
    tokens: torch.Tensor  # (B, L) token position the slot belongs to


# ---- batches ----------------------------------------------------------------------------------------------------
@dataclass
class Example:
    words: list[list[int]]
    codes: np.ndarray  # (K, T)
    frame_words: np.ndarray | None
    prompt_frames: int = 0


def collate(examples: list[Example]) -> Batch:
    """Pad examples into a Batch: BOS on word 1, EOS as word N+1."""
    texts, word_ids = [], []
    for e in examples:
        tokens, ids = [TEXT_BOS], [1]
        for i, word in enumerate(e.words, start=1):
            tokens += word
            ids += [i] * len(word)
        texts.append(tokens + [TEXT_EOS])
        word_ids.append(ids + [len(e.words) + 1])
    B, T, S, K = len(examples), max(map(len, texts)), max(e.codes.shape[1] for e in examples), examples[0].codes.shape[0]
    text = torch.zeros(B, T, dtype=torch.long)
    text_words = torch.zeros(B, T, dtype=torch.long)
    codes = torch.zeros(B, K, S, dtype=torch.long)
    frame_words = torch.zeros(B, S, dtype=torch.long)
    for b, e in enumerate(examples):
        text[b, : len(texts[b])] = torch.tensor(texts[b])
        text_words[b, : len(texts[b])] = torch.tensor(word_ids[b])
        codes[b, :, : e.codes.shape[1]] = torch.from_numpy(e.codes.astype(np.int64))
        if e.frame_words is not None:
            frame_words[b, : e.codes.shape[1]] = torch.from_numpy(e.frame_words.astype(np.int64))
    return Batch(
        text, text_words, torch.tensor([len(t) for t in texts]), codes,
        torch.tensor([e.codes.shape[1] for e in examples]), torch.tensor([e.prompt_frames for e in examples]),
        frame_words,
    )
