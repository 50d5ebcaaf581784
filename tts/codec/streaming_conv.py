"""Convolutions that stream with exact results (as moshi's streaming convs): each layer keeps the input it still
needs in a per-utterance state dict and computes every output once, delayed by its own right context.

Offline (`state=None`) a layer is an ordinary zero-padded convolution. Streaming, chunk after chunk with one state
dict and `final=True` on the last call (an empty chunk is fine), the outputs concatenate to the offline output.
Branches with different delays are re-joined by `aligned_sum`, which holds the longer branch's extra outputs.
"""
from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# oneDNN (PyTorch's CPU convolutions) keeps a compiled kernel per convolution and input shape, 1024 by default; a
# streamed HiFi-GAN (56 convolutions, a few push lengths each) needs more, or every push recompiles. Read when the
# first kernel is made, so set here, below every model; a user's own setting wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "2048")

StreamState = dict  # layer (or (layer, branch)) -> what it holds between chunks; one dict per utterance
UNFOLD_MAX_FRAMES = 64  # inference on up to this many frames runs as one matrix product; longer inputs go to
# PyTorch's convolution, which wins there (HiFi-GAN V1 on 3 s of log-mel, one thread: 1.57 x real time unfolded,
# 0.59 with PyTorch's convolutions)


def native_bf16() -> bool:
    """Whether the CPU computes bfloat16 in hardware (AVX512-BF16 or AMX), where the vocoders run in it. oneDNN also
    accepts bfloat16 on plain AVX-512, emulated, and slower than float32 there."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


class StreamConv1d(nn.Conv1d):
    """Stride-1 Conv1d, zero-padded with `left` frames before and `right` after the sequence: (B, C, T) -> (B, C', T).
    right=None pads symmetrically ('same'); right=0 is causal. Streaming, it lags its input by `right` frames."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, right: int | None = None,
                 groups: int = 1):
        super().__init__(c_in, c_out, kernel, dilation=dilation, groups=groups)
        span = (kernel - 1) * dilation
        self.right = span // 2 if right is None else right
        self.left = span - self.right

    def forward(self, x: torch.Tensor, state: StreamState | None = None, final: bool = True) -> torch.Tensor:
        if state is None:
            return self._conv(F.pad(x, (self.left, self.right)))
        history = state.get(self)
        if history is None:
            history = x.new_zeros(x.shape[0], x.shape[1], self.left)
        x = torch.cat([history, x] + ([x.new_zeros(x.shape[0], x.shape[1], self.right)] if final else []), dim=2)
        ready = x.shape[2] - (self.left + self.right)
        if ready <= 0:
            state[self] = x
            return x.new_zeros(x.shape[0], self.out_channels, 0)
        state[self] = x[:, :, ready:]
        return self._conv(x)

    def _conv(self, x: torch.Tensor) -> torch.Tensor:
        """The unpadded convolution of padded x. At inference a dense kernel runs as one matrix product over the
        unfolded input: on a few frames PyTorch's CPU convolutions (dilated ones above all) cost 5-10 times more."""
        if self.training or self.groups != 1 or x.shape[2] > UNFOLD_MAX_FRAMES:
            return super().forward(x)
        B, C, _ = x.shape
        k, d = self.kernel_size[0], self.dilation[0]
        columns = x.unfold(2, (k - 1) * d + 1, 1)[..., ::d]  # (B, C, T, k)
        columns = columns.permute(0, 2, 1, 3).reshape(B, -1, C * k)
        return F.linear(columns, self.weight.view(self.out_channels, C * k), self.bias).transpose(1, 2)


class StreamConvTranspose1d(nn.ConvTranspose1d):
    """ConvTranspose1d (kernel >= stride, padding <= kernel - stride): (B, C, T) -> (B, C', T * stride + kernel -
    stride - 2 * padding). Streaming, the last kernel - stride samples of each chunk's output wait for the next
    chunk's overlap; the first `padding` samples of the utterance and its last `padding` are cropped as offline."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, padding: int = 0):
        super().__init__(c_in, c_out, kernel, stride=stride, padding=padding)
        assert kernel >= stride and padding <= kernel - stride
        self.overlap = kernel - stride

    def forward(self, x: torch.Tensor, state: StreamState | None = None, final: bool = True) -> torch.Tensor:
        if state is None:
            if self.training:
                return super().forward(x)
            pad = self.padding[0]
            y = self._transposed(x)
            return y[:, :, pad : y.shape[2] - pad] + self.bias.view(1, -1, 1)
        # the overlap is summed in float32 (bfloat16 inference would round it once more than offline, at every join)
        B, stride, n = x.shape[0], self.stride[0], x.shape[2]
        carry, to_drop = state.get(self, (x.new_zeros(B, self.out_channels, self.overlap, dtype=torch.float32),
                                          self.padding[0]))
        if n:
            y = self._transposed(x).float()  # (B, C', (n - 1) * stride + kernel)
            y[:, :, : self.overlap] += carry
            ready, carry = y[:, :, : n * stride], y[:, :, n * stride :]
        else:
            ready = carry.new_zeros(B, self.out_channels, 0)
        if final:
            ready = torch.cat([ready, carry[:, :, : self.overlap - self.padding[0]]], dim=2)
        ready = (ready + self.bias.view(1, -1, 1)).to(x.dtype)
        drop = min(to_drop, ready.shape[2])
        state[self] = (carry, to_drop - drop)
        return ready[:, :, drop:]

    def _transposed(self, x: torch.Tensor) -> torch.Tensor:
        """Unpadded, unbiased transposed convolution (B, C, n) -> (B, C', (n - 1) * stride + kernel). At inference:
        one matrix product, then overlap-add (`fold`); PyTorch's CPU path costs several times more on a few frames."""
        if self.training or x.shape[2] > UNFOLD_MAX_FRAMES:
            return F.conv_transpose1d(x, self.weight, None, self.stride[0])
        B, C, n = x.shape
        k, stride = self.kernel_size[0], self.stride[0]
        columns = torch.matmul(x.transpose(1, 2), self.weight.view(C, -1)).transpose(1, 2)  # (B, C' * k, n)
        length = (n - 1) * stride + k
        return F.fold(columns, (1, length), (1, k), stride=(1, stride))[:, :, 0]


def aligned_sum(parts: list[torch.Tensor], state: StreamState | None, key) -> torch.Tensor:
    """Sum of branches (B, C, T_i) that stream with different delays: returns what all of them have reached and
    holds the rest in state[key]. Offline the lengths are equal and this is a plain sum."""
    if state is None:
        return torch.stack(parts).sum(0)
    pending = state.get(key)
    if pending:  # only the branches that ran ahead hold anything: copy no empty remainder
        pending = [torch.cat([p, x], dim=2) if p.shape[2] else x for p, x in zip(pending, parts)]
    else:
        pending = list(parts)
    n = min(p.shape[2] for p in pending)
    state[key] = [p[:, :, n:] for p in pending]
    total = pending[0][:, :, :n]
    for p in pending[1:]:
        total = total + p[:, :, :n]
    return total


# ---- many streams in one pass ------------------------------------------------------------------------------
# Streams of one model whose states hold the same things in the same shapes (every stream past its first pushes)
# can run one batched call: their states stacked along the batch axis, the outputs and new states split back.
# Rows never mix in these layers, so each stream gets what it would alone, up to float rounding.

def state_signature(state: StreamState) -> frozenset:
    """What must match for states to stack: each key and the shapes (past the batch axis) of what it holds."""
    return frozenset((_key(key), _signature(value)) for key, value in state.items())


def _key(key):
    """A state key by what it names, not by which object says it: a layer by identity, a (layer, branch) tuple by
    its parts. Each stream builds its own tuple keys: told apart by the tuples' identity, only streams that had
    first rendered together (and so shared their tuples) would stack."""
    if isinstance(key, tuple):
        return tuple(_key(part) for part in key)
    return key if isinstance(key, (str, int)) else id(key)


def _signature(value):
    if isinstance(value, torch.Tensor):
        return ("t", tuple(value.shape[1:]), value.dtype)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_signature(v) for v in value))
    return ("v", value)


def stack_states(states: list[StreamState]) -> StreamState:
    """One state for a batch of streams whose `state_signature`s are equal."""
    return {key: _stack([state[key] for state in states]) for key in states[0]}


def _stack(values: list):
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(values, dim=0)
    if isinstance(first, (tuple, list)):
        return type(first)(_stack([v[i] for v in values]) for i in range(len(first)))
    return first  # equal by signature


def split_state(state: StreamState, n: int) -> list[StreamState]:
    """The batch's state after a call, back to its `n` streams."""
    return [{key: _row(value, i) for key, value in state.items()} for i in range(n)]


def _row(value, i: int):
    if isinstance(value, torch.Tensor):
        return value[i : i + 1]
    if isinstance(value, (tuple, list)):
        return type(value)(_row(v, i) for v in value)
    return value
