"""The vocoders' shared training loop, through both trainers, on a two-utterance corpus: weights saved and loadable,
the step count carried on when a run resumes."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from audio_io.wav import read_wav, write_wav
from tts.codec import mel
from tts.codec.mel_codec import MelCodec, MelCodecConfig, MelCodecModel
from tts.codec.vocoder import load_vocoder
from tts.data.corpus import ManifestEntry, write_manifest

FIXTURE = Path(__file__).parents[2] / "data" / "piper_fox.wav"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    audio, _ = read_wav(FIXTURE)
    (root / "wavs").mkdir()
    write_wav(root / "wavs" / "a.wav", audio)
    write_wav(root / "wavs" / "b.wav", audio[::-1].copy())
    write_manifest(root / "train.jsonl", [ManifestEntry(f"wavs/{n}.wav", "fox", len(audio) / 22050, "piper_joe") for n in "ab"])
    return root


@pytest.fixture(scope="module")
def codec() -> MelCodec:
    torch.manual_seed(0)
    return MelCodec(MelCodecModel(MelCodecConfig(channels=32)))


def _steps(out: Path) -> int:
    return torch.load(out / "train_state.pt", weights_only=False)["step"]


@pytest.mark.slow
def test_istft_vocoder_trains_saves_and_resumes(corpus, codec, tmp_path):
    from tts.codec.istft_vocoder import IstftVocoderConfig
    from tts.training.istft_vocoder_train import IstftTrainConfig, train_istft_vocoder

    shape = IstftVocoderConfig(dim=32, intermediate=64, layers=2)
    config = IstftTrainConfig(minutes=0.03, batch=2, segment_frames=16, context_frames=4, utterances=2, teacher="")
    first = train_istft_vocoder(corpus, codec, tmp_path / "voc", shape, config)
    assert first["steps"] >= 1 and _steps(tmp_path / "voc") == first["steps"]
    second = train_istft_vocoder(corpus, codec, tmp_path / "voc", shape, config)
    assert second["steps"] > first["steps"]  # resumed: the count carries on
    vocoder = load_vocoder(str(tmp_path / "voc"))
    assert vocoder.generator.config.kind == "istft"
    assert np.isfinite(vocoder(np.full((8, mel.N_MELS), -5.0, np.float32))).all()
    # a new session continues from the saved weights (no train_state.pt there): it starts where they left off
    from dataclasses import replace

    from tts.codec.vocoder import Vocoder

    start = Vocoder.load(tmp_path / "voc").generator.state_dict()
    resumed = replace(config, init_from=str(tmp_path / "voc"), lr=0.0)
    again = train_istft_vocoder(corpus, codec, tmp_path / "again", shape, resumed)
    assert again["steps"] >= 1  # lr 0: nothing moves, so the saved weights are the starting ones
    ended = Vocoder.load(tmp_path / "again").generator.state_dict()
    assert all(torch.allclose(start[k], ended[k], atol=1e-3) for k in start)


@pytest.mark.slow
def test_hifigan_student_trains_and_logs(corpus, codec, tmp_path):
    from tts.training.vocoder_train import VocoderDistillConfig, distill_vocoder

    config = VocoderDistillConfig(resblock_kernel_sizes=[3], minutes=0.05, batch=1, segment_frames=8, margin_frames=4,
                                  utterances=2)
    log = distill_vocoder(corpus, codec, tmp_path / "student", config)
    assert log["steps"] >= 1 and _steps(tmp_path / "student") == log["steps"]
    assert load_vocoder(str(tmp_path / "student")).generator.config.resblock_kernel_sizes == [3]
    if log["steps"] >= 10:
        assert "total" in json.loads((tmp_path / "student" / "train_log.jsonl").read_text().splitlines()[0])


@pytest.mark.slow
def test_adversarial_istft_run_steps_both_and_resumes_the_discriminators(corpus, codec, tmp_path):
    from tts.codec.istft_vocoder import IstftVocoderConfig
    from tts.training.istft_vocoder_train import IstftTrainConfig, train_istft_vocoder

    shape = IstftVocoderConfig(dim=32, intermediate=64, layers=2)
    config = IstftTrainConfig(minutes=0.05, batch=2, segment_frames=16, context_frames=4, utterances=2, teacher="",
                              adversarial=True, disc_warmup_steps=2)
    first = train_istft_vocoder(corpus, codec, tmp_path / "voc", shape, config)
    state = torch.load(tmp_path / "voc" / "train_state.pt", weights_only=False)
    assert {"discriminators", "disc_optimizer"} <= set(state)
    assert state["disc_optimizer"]["state"]  # the discriminators' optimizer has stepped
    second = train_istft_vocoder(corpus, codec, tmp_path / "voc", shape, config)
    assert second["steps"] > first["steps"]
    if first["steps"] >= 10:  # step 10 is past the first run's 2 warm-up steps (a resumed run warms up again)
        logged = json.loads((tmp_path / "voc" / "train_log.jsonl").read_text().splitlines()[0])
        assert logged["step"] == 10 and {"disc", "adv", "fm"} <= set(logged)


def test_discriminators_learn_to_tell_a_tone_from_noise():
    """A few hinge steps on two kinds of audio: the judges' loss falls and their logits part."""
    from tts.training.discriminators import Discriminators, discriminator_loss, feature_matching_loss, generator_loss

    torch.manual_seed(0)
    judges = Discriminators()
    t = torch.arange(4096) / 22050
    real = torch.stack([0.3 * torch.sin(2 * np.pi * f * t) for f in (220.0, 330.0)])
    fake = 0.3 * torch.randn(2, 4096)
    optimizer = torch.optim.AdamW(judges.parameters(), lr=1e-3)
    first = None
    for _ in range(15):
        loss = discriminator_loss(judges(real), judges(fake))
        first = float(loss.detach()) if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) < first
    judged_real, judged_fake = judges(real), judges(fake)
    assert generator_loss(judged_fake) > generator_loss(judged_real)
    assert float(feature_matching_loss(judged_real, judged_real)) == 0.0
    assert float(feature_matching_loss(judged_real, judged_fake)) > 0.0


@pytest.mark.slow
def test_a_campaign_resumes_from_its_committed_snapshot_on_a_fresh_machine(corpus, codec, tmp_path):
    """Session 1 judges the starting weights (step 0), trains, judges and snapshots (fp16 generator and
    discriminators, the step); session 2 without run_dir (a fresh clone: no optimizer state) carries on from the
    snapshot, its step count and its curve."""
    import shutil

    from tts.training.vocoder_campaign import CampaignConfig, committed_start, read_progress, run_campaign
    from tts.training.istft_vocoder_train import IstftTrainConfig

    codec.save(tmp_path / "codec")
    (tmp_path / "sentences.txt").write_text("The quick brown fox jumps over the lazy dog.\n")
    config = CampaignConfig(corpus=str(corpus), run_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"),
                            codec=str(tmp_path / "codec"), validation_file=str(tmp_path / "sentences.txt"),
                            validation_sentences=1, eval_every_steps=10_000,
                            train=IstftTrainConfig(batch=2, segment_frames=16, context_frames=4, utterances=2, teacher="",
                                                   adversarial=True, disc_real="recordings", disc_batch=2,
                                                   phase_weight=0.0, amp_weight=0.0, init_from="tts/assets/vocoder"))
    first = run_campaign(config, minutes=0.05, log=lambda line: None)
    curve = read_progress(tmp_path / "ckpt")
    assert [p["step"] for p in curve] == [0, first["steps"]]
    assert all(1.0 <= p["distillmos"] <= 5.0 and p["wer"] >= 0 for p in curve)
    snapshot = committed_start(tmp_path / "ckpt")
    assert snapshot["step"] == first["steps"] and snapshot["discriminators"]
    assert all(v.dtype == torch.float32 for v in snapshot["generator"].values())  # stored fp16, loaded as float
    shutil.rmtree(tmp_path / "run")  # a fresh clone has only what was committed
    second = run_campaign(config, minutes=0.05, log=lambda line: None)
    assert second["steps"] > first["steps"]  # the count carries on from the snapshot
    curve = read_progress(tmp_path / "ckpt")
    assert [p["step"] for p in curve] == [0, first["steps"], second["steps"]]
    # the validation set was kept with the snapshot, so session 2 judged the same audio (Piper speaks anew each time)
    assert (tmp_path / "ckpt" / "validation.npz").exists() and len({p["validation"] for p in curve}) == 1


def test_a_campaign_recipe_is_typed_and_unknown_keys_are_refused(tmp_path):
    from audio_io.errors import UserError
    from tts.training.vocoder_campaign import load_campaign_config

    good = tmp_path / "good.yaml"
    good.write_text("eval_every_steps: 100\ntrain:\n  lr: 1e-4\n  adversarial: true\n")
    config = load_campaign_config(good)
    assert config.eval_every_steps == 100 and config.train.lr == 1e-4 and config.train.adversarial is True
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  learning_rate: 1e-4\n")
    with pytest.raises(UserError, match="learning_rate"):
        load_campaign_config(bad)
    bad.write_text("train: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_campaign_config(bad)


@pytest.mark.slow
def test_an_unjudged_run_on_a_compact_corpus_writes_snapshots_that_are_judged_into_the_curve(corpus, codec, tmp_path):
    """A machine without the judges (a GPU): the corpus carried as FLAC (the same samples), training from init_from
    with discriminators of other widths, the generator written `snapshots` times (the last at the end); judged
    later into the campaign's curve under the run's name."""
    from tts.data.corpus import compact_corpus, read_manifest
    from tts.data.features import load_audio
    from tts.training.istft_vocoder_train import IstftTrainConfig
    from tts.training.vocoder_campaign import CampaignConfig, judge_snapshots, read_progress, train_unjudged

    counts = compact_corpus(corpus, tmp_path / "compact", "piper_joe", utterances=2)
    assert counts["utterances"] == 2
    for entry in read_manifest(tmp_path / "compact" / "train.jsonl"):
        assert entry.audio_filepath.endswith(".flac")
        original = [e for e in read_manifest(corpus / "train.jsonl") if e.text == entry.text]
        flac = load_audio(tmp_path / "compact", entry.audio_filepath)
        assert any(np.abs(flac - load_audio(corpus, e.audio_filepath)).max() < 1e-4 for e in original)  # lossless
    codec.save(tmp_path / "codec")
    (tmp_path / "sentences.txt").write_text("The quick brown fox jumps over the lazy dog.\n")
    config = CampaignConfig(corpus=str(tmp_path / "compact"), run_dir=str(tmp_path / "run"),
                            checkpoint_dir=str(tmp_path / "ckpt"), codec=str(tmp_path / "codec"),
                            validation_file=str(tmp_path / "sentences.txt"), validation_sentences=1,
                            train=IstftTrainConfig(batch=2, segment_frames=16, context_frames=4, utterances=2, teacher="",
                                                   adversarial=True, disc_real="recordings", disc_batch=2,
                                                   disc_channels=[8, 16, 16, 32], disc_spec_channels=8,
                                                   phase_weight=0.0, amp_weight=0.0, init_from="tts/assets/vocoder"))
    result = train_unjudged(config, minutes=0.1, out=tmp_path / "snapshots", snapshots=2, log=lambda line: None)
    folders = sorted((tmp_path / "snapshots").iterdir(), key=lambda f: int(f.name.removeprefix("step_")))
    assert len(folders) == 2 and folders[-1].name == f"step_{result['steps']}"
    assert not read_progress(tmp_path / "ckpt")  # nothing judged where the run trained
    judge_snapshots(config, folders, "gpu", log=lambda line: None)
    curve = read_progress(tmp_path / "ckpt")
    assert [(p["step"], p["run"]) for p in curve] == [(int(f.name.removeprefix("step_")), "gpu") for f in folders]
    assert all(1.0 <= p["distillmos"] <= 5.0 for p in curve)


def test_campaign_recipes_resume_from_their_own_folders():
    """configs/vocoder_gan*.yaml load typed (a misspelt key would be refused when a run starts, possibly on a rented
    GPU); the CPU recipe's committed snapshot (training/vocoder_campaign/latest) fits the generator it builds, so
    `s5 codec campaign` resumes it; the GPU recipe, which inherits the rest, never resumes from that folder."""
    from tts.codec.istft_vocoder import IstftGenerator
    from tts.paths import CONFIGS, repo_path
    from tts.training.vocoder_campaign import committed_start, load_campaign_config

    cpu = load_campaign_config(CONFIGS / "vocoder_gan.yaml")
    gpu = load_campaign_config(CONFIGS / "vocoder_gan_gpu.yaml")
    assert repo_path(gpu.checkpoint_dir) != repo_path(cpu.checkpoint_dir)
    assert gpu.validation_file == cpu.validation_file and gpu.train.lr == 2e-4 and gpu.train.batch == 32
    assert gpu.model.lookahead == 2 and gpu.train.teacher == "" and cpu.train.teacher == "universal"  # its own
    start = committed_start(repo_path(cpu.checkpoint_dir))
    assert start is not None and start["step"] > 0
    IstftGenerator(cpu.model).load_state_dict(start["generator"])  # raises on any shape the recipe does not build


def test_the_campaign_rate_halves_by_step_so_that_sessions_continue_one_schedule():
    from tts.training.vocoder_campaign import CampaignConfig, lr_scale

    assert lr_scale(CampaignConfig(), 50_000) == 1.0  # no half-life: constant
    config = CampaignConfig(lr_half_life_steps=4000, lr_decay_from_step=13_250)
    assert lr_scale(config, 10_000) == 1.0 and lr_scale(config, 13_250) == 1.0
    assert lr_scale(config, 17_250) == pytest.approx(0.5) and lr_scale(config, 21_250) == pytest.approx(0.25)
