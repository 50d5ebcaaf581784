"""The NeMo codec adapter on a small randomly initialised AudioCodecModel built from a config (no weights can be
downloaded here). NeMo is the optional `nemo` extra: CI installs it; elsewhere the test is skipped without it."""
import os

import numpy as np
import pytest
import torch

from audio_io.errors import UserError

pytestmark = pytest.mark.slow


def _nemo():
    try:
        from nemo.collections.tts.models import AudioCodecModel
        from omegaconf import OmegaConf
    except ImportError as error:
        if os.environ.get("CI"):
            pytest.fail(f"CI must install the nemo extra: {error}")
        pytest.skip("nemo extra not installed")
    return AudioCodecModel, OmegaConf


def small_codec_config(OmegaConf):
    """A tiny FSQ mel codec: 22.05 kHz, 256 samples per frame (86.13 frames/s), 8 codebooks of [8,5,5,5]."""
    return OmegaConf.create({
        "sample_rate": 22050, "samples_per_frame": 256,
        "mel_loss_l1_scale": 1.0, "mel_loss_l2_scale": 0.0, "stft_loss_scale": 0.0, "time_domain_loss_scale": 0.0,
        "commit_loss_scale": 0.0, "disc_updates_per_period": 1, "disc_update_period": 2,
        "loss_resolutions": [[512, 128, 512], [1024, 256, 1024]], "mel_loss_dims": [40, 80],
        "mel_loss_log_guard": 1.0, "stft_loss_log_guard": 1.0, "feature_loss_type": "absolute",
        "audio_encoder": {
            "_target_": "nemo.collections.tts.modules.audio_codec_modules.MultiBandMelEncoder",
            "mel_bands": [[0, 10], [10, 20], [20, 30], [30, 40], [40, 50], [50, 60], [60, 70], [70, 80]],
            "out_channels": 4, "hidden_channels": 16, "filters": 32,
            "mel_processor": {"_target_": "nemo.collections.tts.modules.audio_codec_modules.MelSpectrogramProcessor",
                              "mel_dim": 80, "sample_rate": 22050, "win_length": 1024, "hop_length": 256},
        },
        "audio_decoder": {"_target_": "nemo.collections.tts.modules.audio_codec_modules.HiFiGANDecoder",
                          "up_sample_rates": [8, 8, 2, 2], "input_dim": 32, "base_channels": 32},
        "vector_quantizer": {"_target_": "nemo.collections.tts.modules.audio_codec_modules.GroupFiniteScalarQuantizer",
                             "num_groups": 8, "num_levels_per_group": [8, 5, 5, 5]},
        "discriminator": {"_target_": "nemo.collections.tts.modules.audio_codec_modules.Discriminator", "discriminators": [
            {"_target_": "nemo.collections.tts.modules.encodec_modules.MultiResolutionDiscriminatorSTFT",
             "resolutions": [[512, 128, 512]]}]},
        "generator_loss": {"_target_": "nemo.collections.tts.losses.audio_codec_loss.GeneratorSquaredLoss"},
        "discriminator_loss": {"_target_": "nemo.collections.tts.losses.audio_codec_loss.DiscriminatorSquaredLoss"},
        "optim": {"_target_": "torch.optim.Adam", "lr": 2e-4},
    })


@pytest.fixture(scope="module")
def nemo_codec():
    AudioCodecModel, OmegaConf = _nemo()
    from tts.codec.nemo import NemoCodec

    torch.manual_seed(0)
    return NemoCodec(AudioCodecModel(cfg=small_codec_config(OmegaConf)))


def test_adapter_shapes_and_frame_rate(nemo_codec):
    assert nemo_codec.sample_rate == 22050 and abs(nemo_codec.frame_rate - 86.13) < 0.01
    assert nemo_codec.num_codebooks == 8 and nemo_codec.codebook_size == 1000
    audio = (0.1 * np.sin(np.arange(22050) * 2 * np.pi * 220 / 22050)).astype(np.float32)
    codes = nemo_codec.encode(audio)
    assert codes.shape[0] == 8 and abs(codes.shape[1] - 22050 / 256) <= 1
    assert int(codes.min()) >= 0 and int(codes.max()) < 1000
    decoded = nemo_codec.decode(codes)
    assert len(decoded) == codes.shape[1] * 256 and np.isfinite(decoded).all()


def test_adapter_streams_with_the_offline_length(nemo_codec):
    codes = torch.randint(0, 1000, (8, 50))
    decoder = nemo_codec.streaming_decoder(context_frames=8, crossfade_frames=1)
    parts = [decoder.push(codes[:, i : i + 7]) for i in range(0, 50, 7)] + [decoder.flush()]
    assert sum(len(p) for p in parts) == len(nemo_codec.decode(codes)) == 50 * 256
    assert decoder.codes.shape[1] <= 8


def test_missing_nemo_file_is_a_clear_error(tmp_path):
    _nemo()
    from tts.codec.nemo import NemoCodec

    with pytest.raises(UserError, match="no NeMo codec"):
        NemoCodec.load(tmp_path / "missing.nemo")
