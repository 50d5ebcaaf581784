"""Streaming primitives must compute exactly what the full forward pass computes."""
import pytest
import torch

from tests.conftest import flatten_words, tiny_config
from tts.model.incremental import DecoderState, IncrementalEncoder, decode_step, encode_many
from tts.model.masks import cross_slot_mask
from tts.model.s5tts import S5TTS, teacher_forcing


def _random_words(generator: torch.Generator, n: int) -> list[list[int]]:
    return [torch.randint(3, 64, (int(torch.randint(1, 6, (1,), generator=generator)),), generator=generator).tolist() for _ in range(n)]


@pytest.mark.parametrize("lookahead, levels", [(2, None), (1, None), (0, None), (None, None), (2, [4, 5]), (None, [4, 5])])
def test_incremental_decoding_equals_full_forward(lookahead, levels):
    g = torch.Generator().manual_seed(7)
    model = S5TTS(tiny_config(lookahead, code_levels=levels)).eval()
    words = _random_words(g, 12)
    tokens, word_ids = flatten_words(words)
    S = 120  # 121 decoder steps including the EOS step
    codes = torch.randint(0, 20, (1, 3, S), generator=g)
    step_words = torch.sort(torch.randint(1, len(words) + 1, (S + 1,), generator=g)).values
    inputs, _, _ = teacher_forcing(codes, torch.tensor([S]), model.config.bos_id, model.config.eos_id)
    with torch.no_grad():
        memory = model.memory_slots(model.encode(tokens, word_ids), word_ids)
        full = model.decode(inputs, memory, step_words[None], return_alignment=True)

    # stream: push words only as each step needs them (word A(s)+k, all of them in T5 mode), as a live LLM would
    encoder, decoder = IncrementalEncoder(model), DecoderState(model)
    pushed, logits, attention = 0, [], []
    for s in range(S + 1):
        needed = len(words) if lookahead is None else min(len(words), int(step_words[s]) + lookahead)
        while pushed < needed:
            encoder.push_word(words[pushed])
            pushed += 1
        if pushed == len(words):
            encoder.end()
        decoder.add_slots(encoder.read_slots())
        out = decode_step(decoder, inputs[0, :, s : s + 1], step_words[s : s + 1])
        logits.append(out.logits[0])
        attention.append(out.token_attention[0])
    diff = (torch.stack(logits) - full.logits[0]).abs().max().item()
    assert diff <= 1e-4, f"incremental logits differ from the full pass by {diff}"
    # the newest step's cross-attention is a distribution over the tokens received so far, none past A(s)+k
    last = attention[-1]
    assert len(last) == tokens.shape[1] and abs(float(last.sum()) - 1.0) < 1e-5
    if lookahead is not None:
        early = attention[0]
        beyond = word_ids[0, : len(early)] > int(step_words[0]) + lookahead
        assert float(early[beyond].sum()) == 0.0



def test_a_step_reads_only_the_slots_its_word_sees_and_new_slots_are_read_at_once():
    """`visible_memory` gathers the slots `cross_slot_mask` opens for a word (one version of each token up to
    A(s) + k); slots added while the word stays the same (here the versions word 4 completes) are in its next
    read."""
    g = torch.Generator().manual_seed(5)
    model = S5TTS(tiny_config(2)).eval()
    words = _random_words(g, 6)
    encoder, decoder = IncrementalEncoder(model), DecoderState(model)
    encoder.push_words(words[:3])
    decoder.add_slots(encoder.read_slots())
    first = decoder.visible_memory(2)
    visible = cross_slot_mask(decoder.slot_words, decoder.slot_versions, torch.tensor([2]), 2)[0]
    assert torch.equal(first.tokens, decoder.slot_tokens[visible])
    assert torch.equal(first.keys[0], decoder.cross_k[0][:, :, visible])
    assert len(set(first.tokens.tolist())) == len(first.tokens)  # one version of each token
    assert decoder.visible_memory(2) is first  # gathered once per word
    encoder.push_words(words[3:])
    encoder.end()
    decoder.add_slots(encoder.read_slots())
    again = decoder.visible_memory(2)
    visible = cross_slot_mask(decoder.slot_words, decoder.slot_versions, torch.tensor([2]), 2)[0]
    assert len(again.tokens) > len(first.tokens) and torch.equal(again.tokens, decoder.slot_tokens[visible])

@pytest.mark.parametrize("lookahead", [2, None])
def test_prefill_equals_stepwise(lookahead):
    """A reference prompt is fed as one multi-frame call; it must equal feeding frames one by one."""
    g = torch.Generator().manual_seed(3)
    model = S5TTS(tiny_config(lookahead)).eval()
    words = _random_words(g, 6)
    codes = torch.randint(0, 20, (3, 40), generator=g)
    step_words = torch.sort(torch.randint(1, 7, (40,), generator=g)).values
    outputs = []
    for chunk in (40, 1):
        encoder, decoder = IncrementalEncoder(model), DecoderState(model)
        for w in words:
            encoder.push_word(w)
        encoder.end()
        decoder.add_slots(encoder.read_slots())
        outputs.append(torch.cat([decode_step(decoder, codes[:, i : i + chunk], step_words[i : i + chunk]).logits for i in range(0, 40, chunk)]))
    assert (outputs[0] - outputs[1]).abs().max() <= 1e-4


def test_encoder_slots_match_full_encoder_versions():
    model = S5TTS(tiny_config(2)).eval()
    g = torch.Generator().manual_seed(5)
    words = _random_words(g, 7)
    tokens, word_ids = flatten_words(words)
    with torch.no_grad():
        full = model.encode(tokens, word_ids)[0]  # (T, J, C)
    encoder = IncrementalEncoder(model)
    updates = []
    for i, w in enumerate(words, start=1):
        encoder.push_word(w)
        update = encoder.read_slots()
        # append-only: each push makes exactly the slots whose horizon is the new word
        assert torch.all(update.words + update.versions == i)
        updates.append(update)
    encoder.end()
    update = encoder.read_slots()
    assert torch.all(update.words + update.versions >= len(words) + 1)
    updates.append(update)
    assert encoder.read_slots() is None
    slots = {(int(t), int(j)): state for u in updates for t, j, state in zip(u.tokens, u.versions, u.states)}
    assert len(slots) == sum(len(u.tokens) for u in updates) == tokens.shape[1] * 3  # every (token, version) once
    for (t, j), state in slots.items():
        assert (state - full[t, j]).abs().max() <= 1e-5, (t, j)


@pytest.mark.parametrize("lookahead", [2, 1, 0])
def test_pushing_words_together_equals_one_by_one(lookahead):
    """A number that expands to many words arrives at once: one pass for all of them, the same slots."""
    model = S5TTS(tiny_config(lookahead)).eval()
    words = _random_words(torch.Generator().manual_seed(11), 9)
    single, batched = IncrementalEncoder(model), IncrementalEncoder(model)
    for w in words:
        single.push_word(w)
    for group in (words[:1], words[1:2], words[2:7], words[7:]):
        batched.push_words(group)
    single.end(), batched.end()
    a, b = single.read_slots(), batched.read_slots()
    for name in ("words", "versions", "tokens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.states - b.states).abs().max() <= 1e-5


@pytest.mark.parametrize("lookahead", [2, 0])
def test_encoders_run_together_make_the_slots_each_makes_alone(lookahead):
    """A server's streams at different points of their texts (new, halfway, ending, ended with no words, and one of
    a full-context model) queue words and run them in one pass: every encoder's slots are those it makes alone, and
    a pass with nothing queued changes nothing."""
    g = torch.Generator().manual_seed(5)
    model, full_context = S5TTS(tiny_config(lookahead)).eval(), S5TTS(tiny_config(None)).eval()
    texts = [_random_words(g, n) for n in (6, 9, 4, 0, 5)]
    plans = [(0, 3, False), (4, 9, False), (2, 4, True), (0, 0, True), (0, 5, True)]  # (words before, queued up to, ends)
    alone, together = [], []
    for i, (words, (before, upto, ends)) in enumerate(zip(texts, plans)):
        for runs in (alone, together):
            encoder = IncrementalEncoder(full_context if i == 4 else model)
            if before:
                encoder.push_words(words[:before])
                encoder.read_slots()  # read already: only the new slots count
            runs.append(encoder)
        alone[-1].push_words(words[before:upto])
        together[-1].queue_words(words[before:upto])
        if ends:
            alone[-1].end()
            together[-1].queue_end()
    passes = []
    for layer in model.encoder_layers:
        layer.attn.query.register_forward_hook(lambda *_: passes.append(1))
    encode_many(together)
    assert len(passes) == len(model.encoder_layers)  # one query projection per layer for the four streams
    encode_many(together)  # nothing queued: nothing happens
    for a, b in zip(alone, together):
        assert not b.queued and b.ended == a.ended
        slots_a, slots_b = a.read_slots(), b.read_slots()
        assert (slots_a is None) == (slots_b is None)
        if slots_a is not None:
            for name in ("words", "versions", "tokens"):
                assert torch.equal(getattr(slots_a, name), getattr(slots_b, name)), name
            assert (slots_a.states - slots_b.states).abs().max() <= 1e-5


def test_read_slots_encodes_what_is_queued():
    model = S5TTS(tiny_config(2)).eval()
    eager, lazy = IncrementalEncoder(model), IncrementalEncoder(model)
    eager.push_words([[5, 6], [7], [8]])
    lazy.queue_words([[5, 6], [7], [8]])
    assert lazy.queued and not lazy.unread
    assert torch.equal(eager.read_slots().states, lazy.read_slots().states) and not lazy.queued


def test_encoder_never_recomputes_finished_words():
    model = S5TTS(tiny_config(2)).eval()
    encoder = IncrementalEncoder(model)
    encoder.push_word([5, 6, 7])
    first_word_keys = encoder.lower_k[0][:, :, :4].clone()  # BOS + 3 tokens
    for w in ([8], [9, 10], [11]):
        encoder.push_word(w)
    assert torch.equal(encoder.lower_k[0][:, :, :4], first_word_keys)
    assert len(encoder.word_starts) == 4


def test_states_are_per_utterance():
    """Two utterances decoded one after another on one model give identical results: nothing carries over."""
    model = S5TTS(tiny_config(2)).eval()
    words = [[5, 6], [7], [8, 9, 10], [11]]
    runs = []
    for _ in range(2):
        encoder, decoder = IncrementalEncoder(model), DecoderState(model)
        for w in words:
            encoder.push_word(w)
        encoder.end()
        decoder.add_slots(encoder.read_slots())
        runs.append(decode_step(decoder, torch.full((3, 1), model.config.bos_id), torch.tensor([1])).logits)
    assert torch.equal(runs[0], runs[1])


def test_push_after_end_and_empty_word_are_refused():
    encoder = IncrementalEncoder(S5TTS(tiny_config(2)).eval())
    with pytest.raises(ValueError):
        encoder.push_word([])
    encoder.end()
    with pytest.raises(RuntimeError):
        encoder.push_word([4])


def test_guided_state_adds_an_unconditional_row_and_keeps_the_text_row():
    """Classifier-free guidance: the text row of a guided state computes what an unguided state does; the second
    row equals the full pass over a memory whose every slot is the null state (the text dropped in training)."""
    g = torch.Generator().manual_seed(5)
    model = S5TTS(tiny_config(2, cfg_dropout=0.1)).eval()
    with torch.no_grad():
        model.null_memory.normal_(generator=g)
    words = _random_words(g, 5)
    tokens, word_ids = flatten_words(words)
    codes = torch.randint(0, 20, (3, 30), generator=g)
    step_words = torch.sort(torch.randint(1, 6, (30,), generator=g)).values
    outputs = []
    for guided in (False, True):
        encoder, decoder = IncrementalEncoder(model), DecoderState(model, guided)
        for w in words:
            encoder.push_word(w)
        encoder.end()
        decoder.add_slots(encoder.read_slots())
        outputs.append([decode_step(decoder, codes[:, i : i + 1], step_words[i : i + 1]) for i in range(30)])
    plain, guided = outputs
    assert all(p.unconditional_logits is None for p in plain)
    assert torch.allclose(torch.cat([p.logits for p in plain]), torch.cat([q.logits for q in guided]), atol=1e-5)
    with torch.no_grad():
        memory = model.memory_slots(model.encode(tokens, word_ids), word_ids)
        dropped = model.drop_text(memory, torch.tensor([True]))
        full = model.decode(codes[None], dropped, step_words[None]).logits[0]
    assert torch.allclose(torch.cat([q.unconditional_logits for q in guided]), full, atol=1e-4)
    assert not torch.allclose(full, torch.cat([q.logits for q in guided]), atol=1e-2)  # the text matters
    with pytest.raises(ValueError, match="cfg_dropout"):
        DecoderState(S5TTS(tiny_config(2)), guided=True)
