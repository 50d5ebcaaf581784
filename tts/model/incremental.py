"""Incremental inference primitives, one state object per utterance (nothing survives a request).

IncrementalEncoder takes words as they arrive. Word-causal layers run once per word (earlier words are never
recomputed); the lookahead layer's version j of word m is computed once word m + j is in, so encoder outputs
become cross-attention memory slots append-only. `end()` adds EOS as word N+1 (its own word, so that knowing the
text has ended changes nothing already computed) and the slots whose horizon lies past the text. Words may also be
queued (`queue_words`, `queue_end`) and run later, the queued words of many encoders in one pass (`encode_many`:
a server's streams), each encoder's slots those it makes alone.

DecoderState holds the self-attention KV cache and the cross-attention keys/values of the slots received so far
(and those the current word reads, gathered once per word: `visible_memory`); `decode_step` runs new frames with
the word A(s) each one belongs to, and returns the newest steps' cross-attention over tokens for word-completion
detection. With `guided`, the state carries a second batch row that reads the model's null state in every slot
(classifier-free guidance): both rows run in one pass, fed the same frames.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F

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
        self._queued: list[list[int]] = []  # words taken and not yet run through the layers (`encode_many`)
        self._end_queued = False  # end() came and its EOS word is not encoded yet

    def push_word(self, token_ids: list[int]) -> None:
        """Add the phoneme ids of the next word (its punctuation included)."""
        self.push_words([token_ids])

    def push_words(self, words: list[list[int]]) -> None:
        """Add several words at once (a number that expands to many): one pass through each layer for all of
        them, the same slots as pushing them one by one."""
        self.queue_words(words)
        encode_many([self])

    def end(self) -> None:
        """The text is complete: EOS arrives as word N+1, and every remaining slot becomes computable."""
        self.queue_end()
        encode_many([self])

    def queue_words(self, words: list[list[int]]) -> None:
        """`push_words` without running the layers yet: the next `encode_many` (or `read_slots`) runs them, for
        many encoders in one pass."""
        if self.ended:
            raise RuntimeError("push_word after end()")
        if any(not ids for ids in words):
            raise ValueError("a word needs at least one token")
        if not words:
            return
        if not self.word_starts and not self._queued:
            words = [[TEXT_BOS, *words[0]], *words[1:]]
        self._queued += [list(ids) for ids in words]

    def queue_end(self) -> None:
        """`end` without running the layers yet (as `queue_words`)."""
        if not self.ended:
            self.ended = self._end_queued = True

    @property
    def queued(self) -> bool:
        """Has it words (or the end) not run through the layers yet?"""
        return bool(self._queued) or self._end_queued

    def read_slots(self) -> SlotUpdate | None:
        """Slots made final since the last read (append-only), or None. Words still queued are encoded first."""
        if self.queued:
            encode_many([self])
        if not self.unread:
            return None
        groups, self.unread = self.unread, []
        return SlotUpdate(*(torch.cat(parts) for parts in zip(*((g.states, g.words, g.versions, g.tokens) for g in groups))))

    # ---- internals (`encode_many` runs them) --------------------------------------------------------------
    def _take_queued(self) -> tuple[int, range] | None:
        """Note the queued words (and EOS after an end) as tokens of this text: (their first token, the horizons
        whose slots they make computable), or None where there is nothing to run (T5 mode: its whole text is
        encoded here, once it has ended)."""
        words, self._queued = self._queued, []
        ending, self._end_queued = self._end_queued and bool(self.word_starts or words), False
        if ending:  # EOS is its own word, so that knowing the text has ended changes nothing already computed
            words.append([TEXT_EOS])
        if not words:
            return None
        start, first = len(self.tokens), len(self.word_starts) + 1
        for token_ids in words:
            self.word_starts.append(len(self.tokens))
            self.word_ids.extend([len(self.word_starts)] * len(token_ids))
            self.tokens.extend(token_ids)
        if self.k is None:  # full context: encode the whole text once, at the end
            if ending:
                encoded = self.model.encode(torch.tensor([self.tokens]), torch.tensor([self.word_ids]))[0, :, 0]  # (T, C)
                T = len(self.tokens)
                self.unread.append(SlotUpdate(encoded, torch.tensor(self.word_ids), torch.zeros(T, dtype=torch.long), torch.arange(T)))
            return None
        return start, range(first, len(self.word_starts) + 1 + (self.k if ending else 0))

    def _slot_rows(self, horizons: range) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The lookahead layer's rows for the slots whose horizon is in `horizons`: version j of word h - j,
        j = 0..k, sees exactly the words <= h. (tokens, versions, keys_ends), or None if there are none."""
        assert self.k is not None
        present = len(self.word_starts)
        groups = [(h, [(h - j, j) for j in range(self.k + 1) if 1 <= h - j <= present]) for h in horizons]
        groups = [(h, members) for h, members in groups if members]
        if not groups:
            return None
        tokens, versions, keys_ends = [], [], []
        for h, members in groups:
            keys_end = self._word_span(min(h, present))[1]
            for m, j in members:
                a, b = self._word_span(m)
                tokens.append(torch.arange(a, b))
                versions.append(torch.full((b - a,), j))
                keys_ends.append(torch.full((b - a,), keys_end))
        return torch.cat(tokens), torch.cat(versions), torch.cat(keys_ends)

    def _word_span(self, word: int) -> tuple[int, int]:
        start = self.word_starts[word - 1]
        end = self.word_starts[word] if word < len(self.word_starts) else len(self.tokens)
        return start, end


@torch.inference_mode()
def encode_many(encoders: list[IncrementalEncoder]) -> None:
    """Run every encoder's queued words (and ends) through the layers: word-causal layers once per new token, the
    lookahead layer once for the slots they make computable. The projections and feed-forwards of the encoders of
    one model run once over all their rows, where a few words' pass is mostly reading the weights (4 ms for 3 words,
    13 for 19, one thread); attention runs per encoder over its own keys. Each encoder's slots are those it makes
    alone (tests)."""
    runs: dict[int, list[tuple[IncrementalEncoder, int, range]]] = {}  # by model: (encoder, first new token, horizons)
    for encoder in encoders:
        if encoder.queued:
            taken = encoder._take_queued()
            if taken is not None:
                runs.setdefault(id(encoder.model), []).append((encoder, *taken))
    for group in runs.values():
        _add_tokens([(encoder, start) for encoder, start, _ in group])
        _emit_slots([(encoder, horizons) for encoder, _, horizons in group])


def _add_tokens(runs: list[tuple[IncrementalEncoder, int]]) -> None:
    """The word-causal layers over each encoder's tokens from `start` on (each sees its own word and earlier ones),
    their keys/values and FFN inputs kept; the lookahead layer's inputs and keys/values of the new tokens."""
    model = runs[0][0].model
    xs, masks = [], []
    for encoder, start in runs:
        n = len(encoder.tokens) - start
        xs.append(model.embed_text(torch.tensor([encoder.tokens[start:]]), torch.arange(start, start + n)))
        word_ids = torch.tensor(encoder.word_ids)
        masks.append(word_ids[None, :] <= word_ids[start:, None])  # (n, start + n) own word and earlier ones
    spans = _spans([x.shape[1] for x in xs])
    x = torch.cat(xs, dim=1)  # (1, N, C): every encoder's new tokens, one after another
    for i, layer in enumerate(model.encoder_layers[:-1]):
        h = layer.norm_attn(x)
        k_new, v_new = layer.attn.project_kv(h)  # (1, nh, N, hs)
        q = layer.attn.project_q(h)
        heads = []
        for (encoder, _), (a, b), mask in zip(runs, spans, masks):
            encoder.lower_k[i] = torch.cat([encoder.lower_k[i], k_new[:, :, a:b]], dim=2)
            encoder.lower_v[i] = torch.cat([encoder.lower_v[i], v_new[:, :, a:b]], dim=2)
            heads.append(layer.attn.attend_heads(q[:, :, a:b], encoder.lower_k[i], encoder.lower_v[i], mask)[0])
        x = x + layer.attn.out(torch.cat(heads, dim=1))
        ffn_in = layer.norm_ffn(x)
        width = layer.ffn.kernel - 1  # the FFN convolution is causal: earlier tokens only
        windows = []
        for (encoder, start), (a, b) in zip(runs, spans):
            history = encoder.lower_ffn_in[i][:, max(0, start - width):]
            history = torch.cat([history.new_zeros(1, width - history.shape[1], history.shape[2]), history], dim=1)
            windows.append(layer.ffn.windows(ffn_in[:, a:b], history))
            encoder.lower_ffn_in[i] = torch.cat([encoder.lower_ffn_in[i], ffn_in[:, a:b]], dim=1)
        x = x + layer.ffn.from_windows(torch.cat(windows, dim=1))
    top = model.encoder_layers[-1]
    k_new, v_new = top.keys_values(x)
    for (encoder, _), (a, b) in zip(runs, spans):
        encoder.top_in = torch.cat([encoder.top_in, x[:, a:b]], dim=1)
        encoder.top_k = torch.cat([encoder.top_k, k_new[:, :, a:b]], dim=2)
        encoder.top_v = torch.cat([encoder.top_v, v_new[:, :, a:b]], dim=2)


def _emit_slots(runs: list[tuple[IncrementalEncoder, range]]) -> None:
    """Each encoder's slots whose horizon is in its range (`IncrementalEncoder._slot_rows`): the lookahead layer
    once over all their rows, every row masked at its own horizon, appended to the encoder's unread slots."""
    rows = [(encoder, encoder._slot_rows(horizons)) for encoder, horizons in runs]
    rows = [(encoder, slot_rows) for encoder, slot_rows in rows if slot_rows is not None]
    if not rows:
        return
    model = rows[0][0].model
    top = model.encoder_layers[-1]
    assert top.ffn.kernel == 1  # pointwise: the rows of different slots and encoders do not mix
    x = torch.cat([encoder.top_in[:, tokens] for encoder, (tokens, _, _) in rows], dim=1)  # (1, R, C)
    q = top.attn.project_q(top.norm_attn(x))
    spans = _spans([len(tokens) for _, (tokens, _, _) in rows])
    heads = []
    for (encoder, (_, _, keys_ends)), (a, b) in zip(rows, spans):
        width = int(keys_ends.max())
        mask = torch.arange(width)[None, :] < keys_ends[:, None]  # (rows, width)
        heads.append(top.attn.attend_heads(q[:, :, a:b], encoder.top_k[:, :, :width], encoder.top_v[:, :, :width], mask)[0])
    x = x + top.attn.out(torch.cat(heads, dim=1))
    x = model.encoder_norm(x + top.ffn.from_windows(top.norm_ffn(x)))[0]  # (R, C)
    for (encoder, (tokens, versions, _)), (a, b) in zip(rows, spans):
        encoder.unread.append(SlotUpdate(x[a:b], torch.tensor(encoder.word_ids)[tokens], versions, tokens))


def _spans(sizes: list[int]) -> list[tuple[int, int]]:
    """Where each of several runs of rows lies in their concatenation: [start, end) per run."""
    return [(end - size, end) for size, end in zip(sizes, accumulate(sizes))]


@dataclass
class VisibleMemory:
    """The memory slots one decoder step reads (`DecoderState.visible_memory`)."""
    word: int  # A(s) of the steps that read them
    keys: list[torch.Tensor]  # per decoder layer (rows, nh, V, hs)
    values: list[torch.Tensor]
    tokens: torch.Tensor  # (V,) the token of each slot


class DecoderState:
    """Per-utterance decoder state: self-attention KV caches and the cross-attention memory slots (row 0: the
    text; row 1 with `guided`: the null state in every slot)."""

    def __init__(self, model: S5TTS, guided: bool = False):
        if guided and model.null_memory is None:
            raise ValueError("guidance needs a model trained with cfg_dropout (it has no null state)")
        self.model = model
        self.guided = guided
        c = model.config
        self.caches = [KVCache() for _ in model.decoder_layers]
        hs = c.d_model // c.n_heads
        rows = 2 if guided else 1
        self.cross_k = [torch.empty(rows, c.n_heads, 0, hs) for _ in model.decoder_layers]
        self.cross_v = [torch.empty(rows, c.n_heads, 0, hs) for _ in model.decoder_layers]
        self.slot_words = torch.empty(0, dtype=torch.long)
        self.slot_versions = torch.empty(0, dtype=torch.long)
        self.slot_tokens = torch.empty(0, dtype=torch.long)
        self.position = 0
        self._visible: VisibleMemory | None = None  # the slots the last one-step word read (`visible_memory`)

    def add_slots(self, update: SlotUpdate | None) -> None:
        add_slots_many([self], [update])

    def visible_memory(self, word: int) -> VisibleMemory:
        """The cross-attention keys/values a step of `word` (its A(s)) may read: one horizon version of each token
        up to word + k, the True entries of `cross_slot_mask`, gathered once per word and per new slots. A step then
        attends to them unmasked: it reads one slot in k + 1 or fewer (a third for S5), where the mask read them
        all and was built every step."""
        if self._visible is None or self._visible.word != word:
            c = self.model.config
            visible = cross_slot_mask(self.slot_words, self.slot_versions, torch.tensor([word]), c.lookahead_words)[0]
            if visible.all() or not visible.any():  # every slot (full context, T5), or none yet: it reads them
                # all (as `additive_mask` does where nothing is visible), so nothing is gathered
                self._visible = VisibleMemory(word, list(self.cross_k), list(self.cross_v), self.slot_tokens)
            else:
                index = visible.nonzero()[:, 0]
                self._visible = VisibleMemory(word, [k.index_select(2, index) for k in self.cross_k],
                                              [v.index_select(2, index) for v in self.cross_v], self.slot_tokens[index])
        return self._visible


@torch.inference_mode()
def add_slots_many(states: list[DecoderState], updates: list[SlotUpdate | None]) -> None:
    """Each state's new memory slots, their cross-attention keys/values projected once per layer for all the
    unguided states of a model (a guided state, with its null row, alone)."""
    groups: dict[int, list[tuple[DecoderState, SlotUpdate]]] = {}
    for state, update in zip(states, updates):
        if update is not None:
            groups.setdefault(-id(state) if state.guided else id(state.model), []).append((state, update))
    for group in groups.values():
        memory = torch.cat([update.states for _, update in group])[None]  # (1, n, C): every state's new slots
        if group[0][0].guided:
            memory = torch.cat([memory, group[0][0].model.null_memory.expand_as(memory)])  # (2, n, C)
        for state, update in group:
            state._visible = None
            state.slot_words = torch.cat([state.slot_words, update.words])
            state.slot_versions = torch.cat([state.slot_versions, update.versions])
            state.slot_tokens = torch.cat([state.slot_tokens, update.tokens])
        spans = _spans([len(update.words) for _, update in group])
        for i, layer in enumerate(group[0][0].model.decoder_layers):
            k, v = layer.cross_attn.project_kv(memory)
            for (state, _), (a, b) in zip(group, spans):
                state.cross_k[i] = torch.cat([state.cross_k[i], k[:, :, a:b]], dim=2)
                state.cross_v[i] = torch.cat([state.cross_v[i], v[:, :, a:b]], dim=2)


@dataclass
class StepOutput:
    logits: torch.Tensor  # (n, K, code_vocab)
    hidden: torch.Tensor  # (n, C)
    token_attention: torch.Tensor  # (n, T) cross-attention of the alignment layers over tokens (head mean)
    unconditional_logits: torch.Tensor | None = None  # (n, K, code_vocab): the null-state row of a guided state


@torch.inference_mode()
def decode_step(state: DecoderState, input_codes: torch.Tensor, step_words: torch.Tensor) -> StepOutput:
    """Run n new decoder positions. input_codes: (K, n) frames fed in (BOS first); step_words: (n,) A(s)."""
    model, c = state.model, state.model.config
    K, n = input_codes.shape
    start = state.position
    positions = torch.arange(start, start + n)
    x = model.embed_frames(input_codes[None]) + sinusoidal_positions(positions, c.d_model)  # (1, n, C)
    if state.guided:
        x = x.expand(2, -1, -1)
    self_mask = causal_mask(start + n)[start:] if n > 1 else None  # one new step sees every cached one
    if n == 1:  # the slots its word sees, unmasked
        memory = state.visible_memory(int(step_words[0]))
        cross_k, cross_v, cross_mask, slot_tokens = memory.keys, memory.values, None, memory.tokens
    else:  # steps of several words (a prompt): every slot, masked per step
        cross_k, cross_v, slot_tokens = state.cross_k, state.cross_v, state.slot_tokens
        cross_mask = cross_slot_mask(state.slot_words, state.slot_versions, step_words, c.lookahead_words)[None]
    attention = []
    for i, layer in enumerate(model.decoder_layers):
        aligned = i in c.alignment_layers
        x, scores = layer(x, self_mask, cross_k[i], cross_v[i], cross_mask, state.caches[i], return_scores=aligned)
        if aligned:
            attention.append(scores[0].softmax(-1).mean(0))  # (n, L): the text row
    state.position += n
    hidden = model.decoder_norm(x)  # (B, n, C)
    logits = model.heads(hidden).view(-1, n, K, c.code_vocab_size)
    token_attention = _token_attention(state, slot_tokens, torch.stack(attention).mean(0))
    return StepOutput(logits[0], hidden[0], token_attention, logits[1] if state.guided else None)


@torch.inference_mode()
def decode_steps(states: list[DecoderState], input_codes: list[torch.Tensor], step_words: list[torch.Tensor]) -> list[StepOutput]:
    """One new decoder position for each of several utterances (unguided states of one model) in one pass: the
    embeddings, projections, feed-forwards and heads run once over the batch, where a CPU step is dispatch-bound;
    attention runs per utterance over its own cache and memory slots (their lengths differ). Row b is
    decode_step(states[b], input_codes[b], step_words[b]). input_codes: B x (K, 1); step_words: B x (1,)."""
    model, c = states[0].model, states[0].model.config
    if any(s.guided or s.model is not model for s in states):
        raise ValueError("decode_steps batches unguided states of one model")
    B, K = len(states), c.num_codebooks
    positions = torch.tensor([s.position for s in states])
    x = model.embed_frames(torch.stack(input_codes)) + sinusoidal_positions(positions, c.d_model)[:, None]  # (B, 1, C)
    memories = [s.visible_memory(int(w[0])) for s, w in zip(states, step_words)]  # the slots each step reads
    attention: list[list[torch.Tensor]] = [[] for _ in states]
    for i, layer in enumerate(model.decoder_layers):
        aligned = i in c.alignment_layers
        h = layer.norm_self(x)
        k, v = layer.self_attn.project_kv(h)  # (B, nh, 1, hs)
        q = layer.self_attn.project_q(h)
        # per stream: one new step sees every cached one (`attend_heads` unmasked, its heads joined once for all)
        heads = [F.scaled_dot_product_attention(q_b, *s.caches[i].extend(k_b, v_b))
                 for s, q_b, k_b, v_b in zip(states, q.split(1), k.split(1), v.split(1))]  # (1, nh, 1, hs) each
        x = x + layer.self_attn.out(_joined(heads))
        q = layer.cross_attn.project_q(layer.norm_cross(x))
        if aligned:  # the alignment layers' scores are read too
            heads = []
            for b, (q_b, memory) in enumerate(zip(q.split(1), memories)):
                y, scores = layer.cross_attn.attend_heads(q_b, memory.keys[i], memory.values[i], None,
                                                          return_scores=True)
                heads.append(y)
                attention[b].append(scores[0].softmax(-1).mean(0))  # (1, V_b)
            x = x + layer.cross_attn.out(torch.cat(heads))
        else:
            heads = [F.scaled_dot_product_attention(q_b, memory.keys[i], memory.values[i])
                     for q_b, memory in zip(q.split(1), memories)]
            x = x + layer.cross_attn.out(_joined(heads))
        x = x + layer.ffn(layer.norm_ffn(x))
    hidden = model.decoder_norm(x)  # (B, 1, C)
    logits = model.heads(hidden).view(B, 1, K, c.code_vocab_size)
    outputs = []
    for b, (s, memory) in enumerate(zip(states, memories)):
        s.position += 1
        token_attention = _token_attention(s, memory.tokens, torch.stack(attention[b]).mean(0))
        outputs.append(StepOutput(logits[b], hidden[b], token_attention))
    return outputs


def _joined(heads: list[torch.Tensor]) -> torch.Tensor:
    """B x (1, nh, 1, hs) one step's attention outputs per stream -> (B, 1, C), the heads side by side."""
    y = torch.cat(heads)
    return y.transpose(1, 2).reshape(len(heads), 1, -1)


def _token_attention(state: DecoderState, slot_tokens: torch.Tensor, slot_attention: torch.Tensor) -> torch.Tensor:
    """(n, L) attention over memory slots whose tokens are `slot_tokens` (L,) -> (n, T) over every text token so far
    (a token's versions summed)."""
    num_tokens = int(state.slot_tokens.max()) + 1 if len(state.slot_tokens) else 0
    return slot_attention.new_zeros(len(slot_attention), num_tokens).index_add_(1, slot_tokens, slot_attention)
