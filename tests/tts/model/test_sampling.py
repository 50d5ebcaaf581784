import torch

from tts.model.sampling import mask_special_codes, sample_codes


def test_top_k_one_is_argmax():
    logits = torch.randn(50, 8, 102)
    assert torch.equal(sample_codes(logits, top_k=1, temperature=0.85), logits.argmax(-1))
    assert torch.equal(sample_codes(logits, top_k=80, temperature=0.0), logits.argmax(-1))


def test_samples_stay_inside_top_k():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 102)
    allowed = logits.topk(5, dim=-1).indices
    for _ in range(300):
        codes = sample_codes(logits, top_k=5, temperature=2.0, generator=g)
        assert torch.all((allowed == codes[:, None]).any(-1))


def test_temperature_changes_the_distribution():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(4000, 1, 4)
    cold = sample_codes(logits, top_k=4, temperature=0.3, generator=g).flatten()
    hot = sample_codes(logits, top_k=4, temperature=3.0, generator=g).flatten()
    share_of_best = lambda codes: (codes == 0).float().mean().item()
    assert share_of_best(cold) > 0.9 and share_of_best(hot) < 0.5
    assert len(set(hot.tolist())) == 4


def test_specials_masked():
    logits = torch.zeros(3, 12)  # codebook_size 10, BOS 10, EOS 11
    logits[:, 10:] = 100.0
    assert torch.all(sample_codes(mask_special_codes(logits, 10, allow_eos=False), 1, 1.0) < 10)
    assert torch.all(sample_codes(mask_special_codes(logits, 10, allow_eos=True), 1, 1.0) == 11)
