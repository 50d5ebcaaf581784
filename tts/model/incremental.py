"""Incremental inference primitives, one state object per utterance (nothing survives a request).

IncrementalEncoder takes words as they arrive. Word-causal layers run once per word (earlier words are never
recomputed); the lookahead layer's version j of word m is computed once word m + j is in, so encoder outputs
become cross-attention memory slots append-only. `end()` adds EOS as word N+1 (its own word, so that knowing the
text has ended changes nothing already computed) and the slots whose horizon lies past the text.

DecoderState holds the self-attention KV cache and the cross-attention keys/values of the slots received so far;
`decode_step` runs new frames with the word A(s) each one belongs to, and returns the newest steps'
cross-attention over tokens for word-completion detection.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tts.model.batch import TEXT_BOS, TEXT_EOS
from tts.model.layers import KVCache, sinusoidal_positions
from tts.model.masks import causal_mask, cross_slot_mask
from tts.model.s5tts import S5TTS


@dataclass
class SlotUpdate:
    """Memory slots that became final: the decoder appends them to its cross-attention keys/values."""
    states: torch.Tensor  # (n, C)
    words: torch.Tensor  # (n,)
    versions: torch.Tensor  # (n,)
    tokens: torch.Tensor  # (n,)


class IncrementalEncoder:
    def __init__(self, model: S5TTS):
        self.model = model
        self.k = model.config.lookahead_words
        c = model.config
        self.tokens: list[int] = []
        self.word_ids: list[int] = []
        self.word_starts: list[int] = []  # first token of each word (the EOS word included after end())
        self.ended = False
        n_lower = len(model.encoder_layers) - 1
        # per word-causal layer: keys/values and FFN inputs of every token so far; then the lookahead layer's
        # inputs and keys/values
        empty_kv = torch.empty(1, c.n_heads, 0, c.d_model // c.n_heads)
        self.lower_k = [empty_kv] * n_lower
        self.lower_v = [empty_kv] * n_lower
        self.lower_ffn_in = [torch.empty(1, 0, c.d_model)] * n_lower
        self.top_in = torch.empty(1, 0, c.d_model)
        self.top_k, self.top_v = empty_kv, empty_kv
        self.unread: list[SlotUpdate] = []  # slot groups not yet handed to the decoder

    @property
    def num_words(self) -> int:
        """Words pushed so far (not counting the EOS word that end() adds)."""
        return len(self.word_starts) - int(self.ended and bool(self.word_starts))

    @torch.no_grad()
    def push_word(self, token_ids: list[int]) -> None:
        """Add the phoneme ids of the next word (its punctuation included)."""
        if self.ended:
            raise RuntimeError("push_word after end()")
        if not token_ids:
            raise ValueError("a word needs at least one token")
        if not self.word_starts:
            token_ids = [TEXT_BOS, *token_ids]
        self._add_word(list(token_ids))
        if self.k is not None:
            self._emit_group(len(self.word_starts))

    @torch.no_grad()
    def end(self) -> None:
        """The text is complete: EOS arrives as word N+1, and every remaining slot becomes computable."""
        if self.ended:
            return
        self.ended = True
        if not self.word_starts:
            return
        self._add_word([TEXT_EOS])
        last = len(self.word_starts)
        if self.k is None:  # full context: encode the whole text once
            encoded = self.model.encode(torch.tensor([self.tokens]), torch.tensor([self.word_ids]))[0, :, 0]  # (T, C)
            T = len(self.tokens)
            self.unread.append(SlotUpdate(encoded, torch.tensor(self.word_ids), torch.zeros(T, dtype=torch.long), torch.arange(T)))
            return
        for horizon in range(last, last + self.k + 1):
            self._emit_group(horizon)

    def read_slots(self) -> SlotUpdate | None:
        """Slots made final since the last read (append-only), or None."""
        if not self.unread:
            return None
        groups, self.unread = self.unread, []
        return SlotUpdate(*(torch.cat(parts) for parts in zip(*((g.states, g.words, g.versions, g.tokens) for g in groups))))

    # ---- internals -----------------------------------------------------------------------------------------
    def _add_word(self, token_ids: list[int]) -> None:
        word = len(self.word_starts) + 1
        start = len(self.tokens)
        self.word_starts.append(start)
        self.tokens.extend(token_ids)
        self.word_ids.extend([word] * len(token_ids))
        if self.k is None:
            return  # T5 mode encodes everything at end()
        n = len(token_ids)
        x = self.model.embed_text(torch.tensor([token_ids]), torch.arange(start, start + n))
        mask = torch.ones(n, start + n, dtype=torch.bool)  # word-causal: own word and every earlier word
        for i, layer in enumerate(self.model.encoder_layers[:-1]):
            k_new, v_new = layer.keys_values(x)
            self.lower_k[i] = torch.cat([self.lower_k[i], k_new], dim=2)
            self.lower_v[i] = torch.cat([self.lower_v[i], v_new], dim=2)
            width = layer.ffn.kernel - 1
            history = self.lower_ffn_in[i][:, max(0, start - width):]
            history = torch.cat([history.new_zeros(1, width - history.shape[1], history.shape[2]), history], dim=1)
            x, ffn_in = layer(x, mask, (self.lower_k[i], self.lower_v[i]), history)
            self.lower_ffn_in[i] = torch.cat([self.lower_ffn_in[i], ffn_in], dim=1)
        self.top_in = torch.cat([self.top_in, x], dim=1)
        k_new, v_new = self.model.encoder_layers[-1].keys_values(x)
        self.top_k = torch.cat([self.top_k, k_new], dim=2)
        self.top_v = torch.cat([self.top_v, v_new], dim=2)

    def _emit_group(self, horizon: int) -> None:
        """Slots whose horizon is `horizon`: version j of word horizon - j, j = 0..k. They all see exactly the
        words <= horizon, so the lookahead layer runs once with every present key up to there visible."""
        assert self.k is not None
        present = len(self.word_starts)
        members = [(horizon - j, j) for j in range(self.k + 1) if 1 <= horizon - j <= present]
        if not members:
            return
        keys_end = self._word_span(min(horizon, present))[1]
        spans = [self._word_span(m) for m, _ in members]
        tokens = torch.cat([torch.arange(a, b) for a, b in spans])
        versions = torch.cat([torch.full((b - a,), j) for (a, b), (_, j) in zip(spans, members)])
        top = self.model.encoder_layers[-1]
        kv = (self.top_k[:, :, :keys_end], self.top_v[:, :, :keys_end])
        out, _ = top(self.top_in[:, tokens], torch.ones(len(tokens), keys_end, dtype=torch.bool), kv)
        words = torch.tensor(self.word_ids)[tokens]
        self.unread.append(SlotUpdate(self.model.encoder_norm(out)[0], words, versions, tokens))

    def _word_span(self, word: int) -> tuple[int, int]:
        start = self.word_starts[word - 1]
        end = self.word_starts[word] if word < len(self.word_starts) else len(self.tokens)
        return start, end


class DecoderState:
    """Per-utterance decoder state: self-attention KV caches and the cross-attention memory slots."""

    def __init__(self, model: S5TTS):
        self.model = model
        c = model.config
        self.caches = [KVCache() for _ in model.decoder_layers]
        hs = c.d_model // c.n_heads
        self.cross_k = [torch.empty(1, c.n_heads, 0, hs) for _ in model.decoder_layers]
        self.cross_v = [torch.empty(1, c.n_heads, 0, hs) for _ in model.decoder_layers]
        self.slot_words = torch.empty(0, dtype=torch.long)
        self.slot_versions = torch.empty(0, dtype=torch.long)
        self.slot_tokens = torch.empty(0, dtype=torch.long)
        self.position = 0

    @torch.no_grad()
    def add_slots(self, update: SlotUpdate | None) -> None:
        if update is None:
            return
        self.slot_words = torch.cat([self.slot_words, update.words])
        self.slot_versions = torch.cat([self.slot_versions, update.versions])
        self.slot_tokens = torch.cat([self.slot_tokens, update.tokens])
        for i, layer in enumerate(self.model.decoder_layers):
            k, v = layer.cross_attn.project_kv(update.states[None])
            self.cross_k[i] = torch.cat([self.cross_k[i], k], dim=2)
            self.cross_v[i] = torch.cat([self.cross_v[i], v], dim=2)


@dataclass
class StepOutput:
    logits: torch.Tensor  # (n, K, code_vocab)
    hidden: torch.Tensor  # (n, C)
    token_attention: torch.Tensor  # (n, T) cross-attention of the alignment layers over tokens (head mean)


@torch.no_grad()
def decode_step(state: DecoderState, input_codes: torch.Tensor, step_words: torch.Tensor) -> StepOutput:
    """Run n new decoder positions. input_codes: (K, n) frames fed in (BOS first); step_words: (n,) A(s)."""
    model, c = state.model, state.model.config
    K, n = input_codes.shape
    start = state.position
    positions = torch.arange(start, start + n)
    x = model.embed_frames(input_codes[None]) + sinusoidal_positions(positions, c.d_model)
    self_mask = causal_mask(start + n)[start:]
    cross_mask = cross_slot_mask(state.slot_words, state.slot_versions, step_words, c.lookahead_words)[None]
    attention = []
    for i, layer in enumerate(model.decoder_layers):
        aligned = i in c.alignment_layers
        x, scores = layer(x, self_mask, state.cross_k[i], state.cross_v[i], cross_mask, state.caches[i], return_scores=aligned)
        if aligned:
            attention.append(scores.softmax(-1).mean(1)[0])  # (n, L)
    state.position += n
    hidden = model.decoder_norm(x)[0]
    logits = model.heads(hidden).view(n, K, c.code_vocab_size)
    slot_attention = torch.stack(attention).mean(0)  # (n, L)
    num_tokens = int(state.slot_tokens.max()) + 1 if len(state.slot_tokens) else 0
    token_attention = slot_attention.new_zeros(n, num_tokens).index_add_(1, state.slot_tokens, slot_attention)
    return StepOutput(logits, hidden, token_attention)
