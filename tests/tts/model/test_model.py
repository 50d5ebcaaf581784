import pytest
import torch

from tests.conftest import tiny_config
from tts.model.batch import Batch
from tts.model.config import ModelConfig, from_dict, load_model_config
from tts.model.losses import codebook_cross_entropy
from tts.model.s5tts import S5TTS, teacher_forcing


def _count(config: ModelConfig) -> int:
    with torch.device("meta"):
        return S5TTS(config).num_parameters()


def test_paper_config_has_about_160m_parameters():
    config = load_model_config("s5_paper")
    assert (config.encoder_layers, config.decoder_layers, config.d_model, config.d_ffn, config.n_heads) == (4, 8, 768, 4096, 8)
    assert (config.num_codebooks, config.codebook_size, config.dropout) == (8, 1000, 0.1)
    assert 150e6 <= _count(config) <= 170e6


def test_t5_and_s5_share_one_architecture():
    """The same model but for the mask and S5's learned null state for guidance (`cfg_dropout`)."""
    import dataclasses

    s5, t5 = load_model_config("s5_default"), load_model_config("t5_default")
    assert s5.lookahead_words == 2 and t5.lookahead_words is None and s5.cfg_dropout > 0 == t5.cfg_dropout
    assert _count(dataclasses.replace(s5, cfg_dropout=0.0)) == _count(t5) < _count(s5) < _count(load_model_config("s5_paper"))


def test_unknown_config_keys_are_refused():
    with pytest.raises(ValueError, match="unknown key d_modle"):
        from_dict(ModelConfig, {"d_modle": 3})
    with pytest.raises(ValueError):
        ModelConfig(alignment_layers=[9])


def test_teacher_forcing_layout():
    codes = torch.tensor([[[4, 5, 6]]])
    inputs, targets, valid = teacher_forcing(codes, torch.tensor([2]), bos=10, eos=11)
    assert inputs.tolist() == [[[10, 4, 5, 6]]]
    assert targets[0, 0, :3].tolist() == [4, 5, 11]
    assert valid.tolist() == [[True, True, True, False]]


def test_prompt_frames_carry_no_cross_entropy():
    logits = torch.randn(1, 6, 2, 7, requires_grad=True)
    targets = torch.randint(0, 7, (1, 2, 6))
    mask = torch.arange(6)[None] >= 2  # the first two frames are the prompt
    codebook_cross_entropy(logits, targets, mask).backward()
    assert torch.all(logits.grad[0, :2] == 0) and torch.any(logits.grad[0, 2:] != 0)


def _one_utterance(config: ModelConfig, T: int = 30, S: int = 80, N: int = 8) -> Batch:
    g = torch.Generator().manual_seed(0)
    inner = torch.sort(torch.cat([torch.arange(1, N + 1), torch.randint(1, N + 1, (T - 2 - N,), generator=g)])).values
    text_words = torch.cat([torch.tensor([1]), inner, torch.tensor([N + 1])])[None]
    text = torch.randint(3, config.phoneme_vocab_size, (1, T), generator=g)
    text[0, 0], text[0, -1] = 1, 2
    codes = torch.randint(0, config.codebook_size, (1, config.num_codebooks, S), generator=g)
    return Batch(text, text_words, torch.tensor([T]), codes, torch.tensor([S]))


def test_forward_aligns_every_word_and_masks_padding():
    config = tiny_config(2)
    model = S5TTS(config)
    a, b = _one_utterance(config, T=20, S=50, N=6), _one_utterance(config, T=14, S=30, N=4)
    pad = lambda x, n: torch.nn.functional.pad(x, (0, n - x.shape[-1]))
    batch = Batch(
        torch.cat([a.text, pad(b.text, 20)]), torch.cat([a.text_words, pad(b.text_words, 20)]), torch.tensor([20, 14]),
        torch.cat([a.codes, pad(b.codes, 50)]), torch.tensor([50, 30]),
    )
    out = model(batch, prior_strength=1.0)
    assert torch.isfinite(out.losses.total)
    assert out.frame_words[1, 30:].eq(0).all()
    for row, (n_frames, n_words) in enumerate([(50, 6), (30, 4)]):
        a_s = out.frame_words[row, :n_frames]
        assert torch.all(a_s[1:] >= a_s[:-1])
        assert set(a_s.tolist()) >= set(range(1, n_words + 1))
    out.losses.total.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_guidance_dropout_trains_the_null_state_only_on_dropped_rows():
    """cfg_dropout: dropped rows read the null state in every slot, so its gradient comes from them alone; a model
    without it has no null state, and evaluation never drops."""
    assert S5TTS(tiny_config(2)).null_memory is None
    model = S5TTS(tiny_config(2, cfg_dropout=0.5))
    batch = _one_utterance(model.config, T=20, S=40, N=6)
    grads = []
    for seed in range(12):  # one row: dropped in about half of the passes
        torch.manual_seed(seed)
        model.zero_grad()
        model(batch).losses.total.backward()
        grads.append(model.null_memory.grad is not None and bool(model.null_memory.grad.abs().sum() > 0))
    assert any(grads) and not all(grads)
    model.eval()
    with torch.no_grad():
        outs = [model(batch).losses.total for _ in range(2)]
    assert torch.equal(*outs)
    with pytest.raises(Exception, match="cfg_dropout"):
        tiny_config(2, cfg_dropout=1.0)


def test_the_model_overfits_one_utterance_with_every_loss():
    """Every loss on, and each falls on one utterance: the gradients reach what they should (a small model shows it
    as well as the shipped size, in seconds)."""
    torch.manual_seed(0)
    config = tiny_config(2, d_model=64, d_ffn=128)
    model = S5TTS(config)
    batch = _one_utterance(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    history = []
    for step in range(250):
        out = model(batch, prior_strength=1.0 if step < 100 else 0.0)
        optimizer.zero_grad()
        out.losses.total.backward()
        optimizer.step()
        history.append(out.losses.as_floats())
    first, last = history[0], history[-1]
    assert all(last[name] > 0 for name in ("ce", "aux", "cross_ctc"))  # every loss was on
    assert last["total"] < 0.2 * first["total"], (first, last)
    assert last["ce"] < 0.1 * first["ce"] and last["aux"] < 0.5 * first["aux"] and last["cross_ctc"] < 0.1 * first["cross_ctc"]


def test_factorised_codes_are_a_product_of_digit_distributions():
    """With code_levels, log p(code) = sum over digits of log p(digit) (up to the BOS/EOS mass), and codes that
    share digits share embedding parts."""
    from tts.model.s5tts import CodeEmbedding, CodeHeads, digit_matrix

    levels = [4, 5]
    assert digit_matrix(levels).sum(0).eq(2).all() and digit_matrix(levels).shape == (9, 20)
    config = tiny_config(2, code_levels=levels)
    heads = CodeHeads(config)
    hidden = torch.randn(3, config.d_model)
    logits = heads(hidden)  # (3, K, 22)
    assert logits.shape == (3, config.num_codebooks, 22)
    raw = heads.linear(hidden).view(3, config.num_codebooks, 11)
    code = 2 + 4 * 3  # digits (2, 3)
    assert torch.allclose(logits[..., code], raw[..., 2] + raw[..., 4 + 3])
    embedding = CodeEmbedding(config)
    codes = torch.tensor([[[code, config.codebook_size + 1]] * config.num_codebooks])  # (1, K, 2): a code, then EOS
    embedded = embedding(codes)[0]  # (2, C)
    assert torch.allclose(embedded[0], (embedding.digit_weight[:, 2] + embedding.digit_weight[:, 4 + 3]).sum(0), atol=1e-6)
    assert torch.allclose(embedded[1], embedding.special_weight[:, 1].sum(0), atol=1e-6)
    with pytest.raises(ValueError, match="do not multiply"):
        tiny_config(2, code_levels=[4, 4])
