"""S5-TTS: a T5-TTS encoder-decoder over phonemes and codec frames with lookahead-causal masks.

`ModelConfig.lookahead_words = k` gives S5-TTS; `None` gives the full-context T5-TTS baseline from the same class.
Read top to bottom: embeddings, encoder (horizon versions, see masks.py), decoder over memory slots, training
forward with alignment and losses. Streaming inference lives in incremental.py and reuses these parts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn

from tts.model.alignment import (
    beta_binomial_log_prior,
    monotonic_alignment_search,
    step_words_from_path,
)
from tts.model.aux_attention import ConvAuxAttention
from tts.model.batch import TEXT_PAD, Batch, Memory
from tts.model.config import ModelConfig
from tts.model.layers import DecoderLayer, EncoderLayer, sinusoidal_positions
from tts.model.losses import LossWeights, TrainingLosses, assemble_losses
from tts.model.masks import (
    causal_mask,
    cross_slot_mask,
    encoder_mask,
    num_horizon_versions,
)


@dataclass
class DecoderOutput:
    hidden: torch.Tensor  # (B, S, C) final decoder states (after the last norm)
    logits: torch.Tensor  # (B, S, K, code_vocab)
    alignment_scores: torch.Tensor | None  # (B, S, L) cross-attention logits of the alignment layers, head mean


@dataclass
class ModelOutput:
    logits: torch.Tensor  # (B, S + 1, K, code_vocab)
    hidden: torch.Tensor  # (B, S + 1, C)
    frame_words: torch.Tensor  # (B, S) A(s) used for M_dec
    aux_log_probs: torch.Tensor  # (B, S, T)
    losses: TrainingLosses = field(default=None)  # type: ignore[assignment]


def teacher_forcing(codes: torch.Tensor, code_lens: torch.Tensor, bos: int, eos: int):
    """Decoder inputs [BOS, c_0 .. c_{S-1}] and targets [c_0 .. c_{L-1}, EOS]. codes: (B, K, S) ->
    inputs, targets: (B, K, S + 1); valid: (B, S + 1) marks real target positions (frames and the EOS)."""
    B, K, S = codes.shape
    inputs = torch.cat([codes.new_full((B, K, 1), bos), codes], dim=2)
    targets = torch.cat([codes, codes.new_zeros(B, K, 1)], dim=2)
    positions = torch.arange(S + 1, device=codes.device)
    is_eos = positions[None, :] == code_lens[:, None]  # (B, S + 1)
    targets = torch.where(is_eos[:, None, :], torch.full_like(targets, eos), targets)
    return inputs, targets, positions[None, :] <= code_lens[:, None]


def digit_matrix(levels: list[int]) -> torch.Tensor:
    """(sum(levels), prod(levels)) 0/1: column c has a one at each of code c's digits (offset per digit)."""
    size, rows = math.prod(levels), []
    for code in range(size):
        digits, offset, rest = [], 0, code
        for level in levels:
            digits.append(offset + rest % level)
            rest, offset = rest // level, offset + level
        rows.append(digits)
    matrix = [[0.0] * size for _ in range(sum(levels))]
    for code, digits in enumerate(rows):
        for d in digits:
            matrix[d][code] = 1.0
    return torch.tensor(matrix)


class CodeEmbedding(nn.Module):
    """(B, K, S) codes -> (B, S, C), summed over codebooks. Factorised (code_levels set): a code's embedding is
    the sum of its FSQ digits' embeddings; BOS/EOS have their own rows."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.factorised = c.code_levels is not None
        if self.factorised:
            self.register_buffer("digits", digit_matrix(c.code_levels), persistent=False)  # (L, V)
            self.digit_weight = nn.Parameter(torch.randn(c.num_codebooks, sum(c.code_levels), c.d_model) * 0.02)
            self.special_weight = nn.Parameter(torch.randn(c.num_codebooks, c.code_vocab_size - c.codebook_size, c.d_model) * 0.02)
        else:
            self.tables = nn.ModuleList(nn.Embedding(c.code_vocab_size, c.d_model) for _ in range(c.num_codebooks))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        if not self.factorised:
            return sum(table(codes[:, k]) for k, table in enumerate(self.tables))
        # gather each code's digit indicators rather than build (V, C) tables: a decoder step embeds one frame,
        # and building 8 tables of 1000 rows cost a third of the step
        V = self.digits.shape[1]
        is_code = codes < V
        indicators = self.digits.t()[codes.clamp(max=V - 1)]  # (B, K, S, L) 0/1 over the FSQ digits
        embedded = torch.einsum("bksl,klc->bksc", indicators, self.digit_weight)
        special = self.special_weight[torch.arange(codes.shape[1], device=codes.device)[:, None], (codes - V).clamp(min=0)]  # (B, K, S, C)
        return torch.where(is_code[..., None], embedded, special).sum(1)


class CodeHeads(nn.Module):
    """(..., C) -> (..., K, V) logits. Factorised: a code's logit is the sum of its digits' logits (a product of
    per-digit distributions over the codes), BOS/EOS logits come straight from the hidden state."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.K, self.V = c.num_codebooks, c.code_vocab_size
        self.factorised = c.code_levels is not None
        if self.factorised:
            self.register_buffer("digits", digit_matrix(c.code_levels), persistent=False)  # (L, codebook_size)
            self.n_digits, self.n_special = sum(c.code_levels), c.code_vocab_size - c.codebook_size
            self.linear = nn.Linear(c.d_model, self.K * (self.n_digits + self.n_special))
        else:
            self.linear = nn.Linear(c.d_model, self.K * self.V)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.linear(hidden)
        if not self.factorised:
            return out.view(*hidden.shape[:-1], self.K, self.V)
        out = out.view(*hidden.shape[:-1], self.K, self.n_digits + self.n_special)
        digit_logits, special_logits = out.split([self.n_digits, self.n_special], dim=-1)
        return torch.cat([digit_logits @ self.digits, special_logits], dim=-1)


class S5TTS(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = c = config
        self.phoneme_embedding = nn.Embedding(c.phoneme_vocab_size, c.d_model, padding_idx=TEXT_PAD)
        self.code_embedding = CodeEmbedding(c)
        # word-causal layers (causal conv FFN) then the one lookahead layer (pointwise FFN: it exists in k+1 versions)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(c.d_model, c.n_heads, c.d_ffn, c.encoder_ffn_kernel if i < c.encoder_layers - 1 else 1, c.dropout)
            for i in range(c.encoder_layers)
        )
        self.encoder_norm = nn.LayerNorm(c.d_model)
        self.decoder_layers = nn.ModuleList(DecoderLayer(c.d_model, c.n_heads, c.d_ffn, c.dropout) for _ in range(c.decoder_layers))
        self.decoder_norm = nn.LayerNorm(c.d_model)
        self.heads = CodeHeads(c)  # K heads stacked in one matmul
        self.aux_attention = ConvAuxAttention(c.d_model, c.aux_channels, c.aux_delta)
        self.drop = nn.Dropout(c.dropout)
        # classifier-free guidance: what the decoder reads where text was dropped (training) or for the unconditional
        # row (inference); every slot gets the same state, so the masks and the alignment stay as they are
        self.null_memory = nn.Parameter(torch.zeros(c.d_model)) if c.cfg_dropout > 0 else None
        # embeddings start at std 0.02; scaled by sqrt(d) they meet the unit-amplitude sinusoidal positions on
        # equal terms (unscaled, position swamps content and the decoder long ignores the previous frame)
        self.embedding_scale = c.d_model**0.5
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # ---- embeddings -------------------------------------------------------------------------------------------
    def embed_text(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, T) ids, (T,) positions -> (B, T, C)"""
        return self.drop(self.phoneme_embedding(tokens) * self.embedding_scale + sinusoidal_positions(positions, self.config.d_model))

    def embed_frames(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the K codebook embeddings of each frame. (B, K, S) -> (B, S, C)"""
        return self.code_embedding(codes) * self.embedding_scale

    # ---- encoder ----------------------------------------------------------------------------------------------
    def encode(self, tokens: torch.Tensor, word_ids: torch.Tensor) -> torch.Tensor:
        """tokens, word_ids: (B, T) -> (B, T, J, C): version j of a token of word m has seen words <= m + j
        (J = k + 1); in T5 mode J = 1 and every token has seen the whole text."""
        k = self.config.lookahead_words
        B, T = tokens.shape
        x = self.embed_text(tokens, torch.arange(T, device=tokens.device))
        lower_mask = encoder_mask(word_ids, None if k is None else 0)  # (B, T, T): own and earlier words
        for layer in self.encoder_layers[:-1]:
            x, _ = layer(x, lower_mask)
        top = self.encoder_layers[-1]
        kv = top.keys_values(x)
        versions = [top(x, encoder_mask(word_ids, None if k is None else j), kv)[0] for j in range(num_horizon_versions(k))]
        return self.encoder_norm(torch.stack(versions, dim=2))

    def memory_slots(self, encoded: torch.Tensor, word_ids: torch.Tensor) -> Memory:
        """Flatten (B, T, J, C) encoder versions into (B, T * J) memory slots with their metadata."""
        B, T, J, C = encoded.shape
        versions = torch.arange(J, device=encoded.device).expand(B, T, J)
        tokens = torch.arange(T, device=encoded.device)[:, None].expand(B, T, J)
        return Memory(
            states=encoded.reshape(B, T * J, C),
            words=word_ids[:, :, None].expand(B, T, J).reshape(B, T * J),
            versions=versions.reshape(B, T * J),
            tokens=tokens.reshape(B, T * J),
        )

    def drop_text(self, memory: Memory, rows: torch.Tensor) -> Memory:
        """Memory whose rows (B,) bool see the null state in every slot (classifier-free guidance)."""
        assert self.null_memory is not None
        states = torch.where(rows[:, None, None], self.null_memory.expand_as(memory.states), memory.states)
        return replace(memory, states=states)

    # ---- decoder ----------------------------------------------------------------------------------------------
    def decode(
        self, input_codes: torch.Tensor, memory: Memory, step_words: torch.Tensor,
        prior_bias: torch.Tensor | None = None, return_alignment: bool = False,
    ) -> DecoderOutput:
        """Whole-sequence decoder pass (training, and the naive reference for the KV cache).
        input_codes: (B, K, S); step_words A(s): (B, S); prior_bias: (B, S, L) added to the alignment layers'
        cross-attention logits."""
        c = self.config
        B, K, S = input_codes.shape
        x = self.drop(self.embed_frames(input_codes) + sinusoidal_positions(torch.arange(S, device=input_codes.device), c.d_model))
        self_mask = causal_mask(S, input_codes.device)
        cross_mask = cross_slot_mask(memory.words, memory.versions, step_words, c.lookahead_words)  # (B, S, L)
        scores = []
        for i, layer in enumerate(self.decoder_layers):
            aligned = i in c.alignment_layers
            cross_k, cross_v = layer.cross_attn.project_kv(memory.states)
            x, layer_scores = layer(
                x, self_mask, cross_k, cross_v, cross_mask,
                cross_bias=prior_bias if aligned else None, return_scores=aligned and return_alignment,
            )
            if layer_scores is not None:
                scores.append(layer_scores.mean(1))
        hidden = self.decoder_norm(x)
        logits = self.heads(hidden)  # (B, S, K, V)
        return DecoderOutput(hidden, logits, torch.stack(scores).mean(0) if scores else None)

    # ---- training ---------------------------------------------------------------------------------------------
    def align(self, batch: Batch, use_prior_path: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Aux attention log-probs (B, S, T), the beta-binomial log prior (B, S, T), and A(s) per frame (B, S):
        given in the batch (rows whose first frame has word 0 are unknown), else MAS on the aux attention (or on
        the prior alone while the aux attention is still untrained)."""
        B, K, S = batch.codes.shape
        T = batch.text.shape[1]
        log_prior = beta_binomial_log_prior(batch.code_lens, batch.text_lens, S, T, self.config.prior_scaling)
        text_mask = batch.text_words > 0
        aux = self.aux_attention(self.phoneme_embedding(batch.text), text_mask, self.embed_frames(batch.codes), log_prior)
        known = batch.frame_words[:, 0] > 0 if batch.frame_words is not None else torch.zeros(B, dtype=torch.bool)
        if bool(known.all()):
            return aux, log_prior, batch.frame_words
        source = log_prior if use_prior_path else aux
        path = monotonic_alignment_search(source.detach().float().cpu().numpy(), batch.code_lens.cpu().numpy(), batch.text_lens.cpu().numpy())
        frame_words = step_words_from_path(torch.from_numpy(path).to(batch.text.device), batch.text_words)
        if batch.frame_words is not None:
            frame_words = torch.where(known[:, None].to(frame_words.device), batch.frame_words, frame_words)
        return aux, log_prior, frame_words

    def forward(
        self, batch: Batch, weights: LossWeights | None = None, prior_strength: float = 0.0, use_prior_path: bool = False
    ) -> ModelOutput:
        """Teacher-forced training pass with every loss. prior_strength scales the beta-binomial prior added to
        the alignment layers' cross-attention (1 early in training, faded to 0)."""
        c = self.config
        weights = weights or LossWeights(c.ce_weight, c.aux_loss_weight, c.cross_ctc_weight)
        aux, log_prior, frame_words = self.align(batch, use_prior_path)
        inputs, targets, valid = teacher_forcing(batch.codes, batch.code_lens, c.bos_id, c.eos_id)
        # A(s) per decoder position: the frame's word (frames aligned to EOS count as the last real word), and
        # the last real word for the EOS step and padding
        last_word = (batch.text_words.max(dim=1).values - 1).clamp(min=1)[:, None]  # (B, 1)
        S = batch.codes.shape[2]
        is_frame = torch.arange(S, device=inputs.device)[None, :] < batch.code_lens[:, None]
        step_words = torch.cat([torch.where(is_frame, frame_words.clamp(max=last_word), last_word), last_word], dim=1)
        memory = self.memory_slots(self.encode(batch.text, batch.text_words), batch.text_words)
        if self.training and self.null_memory is not None:
            memory = self.drop_text(memory, torch.rand(memory.states.shape[0], device=inputs.device) < c.cfg_dropout)
        prior_bias = None
        if prior_strength > 0:
            prior_bias = prior_strength * torch.cat([log_prior, log_prior[:, -1:]], dim=1).gather(
                2, memory.tokens[:, None, :].expand(-1, S + 1, -1))
        out = self.decode(inputs, memory, step_words, prior_bias, return_alignment=True)
        loss_mask = valid
        if batch.prompt_lens is not None:
            loss_mask = loss_mask & (torch.arange(S + 1, device=inputs.device)[None, :] >= batch.prompt_lens[:, None])
        losses = assemble_losses(
            out.logits, targets, loss_mask, aux, out.alignment_scores[:, :S], memory,
            batch.text_lens, batch.code_lens, weights,
        )
        return ModelOutput(out.logits, out.hidden, frame_words, aux, losses)
