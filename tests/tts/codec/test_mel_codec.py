"""The FSQ mel codec: shapes, exact streaming, save/load, the codec dispatch, and a short training run."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from audio_io.errors import UserError
from audio_io.wav import read_wav
from tts.codec import mel
from tts.codec.load import load_codec
from tts.codec.mel_codec import MelCodec, MelCodecConfig, MelCodecModel
from tts.codec.vocoder import Vocoder

FIXTURE = Path(__file__).parents[2] / "data" / "piper_fox.wav"


@pytest.fixture(scope="module")
def fox_mel() -> np.ndarray:
    audio, _ = read_wav(FIXTURE)
    return mel.log_mel(audio)


@pytest.fixture(scope="module", params=[1, 0], ids=["lookahead1", "causal"])
def tiny_codec(fox_mel, request) -> MelCodec:
    torch.manual_seed(0)
    model = MelCodecModel(MelCodecConfig(channels=32, decoder_lookahead=request.param))
    model.mel_mean.copy_(torch.from_numpy(fox_mel.mean(0)))
    model.mel_std.copy_(torch.from_numpy(fox_mel.std(0) + 1e-3))
    return MelCodec(model, Vocoder.load())  # float32 V1: streaming exact sample for sample


def test_codes_and_lengths(tiny_codec, fox_mel):
    codes = tiny_codec.encode_features(fox_mel)
    assert codes.shape == (8, -(-len(fox_mel) // 4)) and codes.min() >= 0 and codes.max() < 1000
    assert abs(tiny_codec.frame_rate - 21.53) < 0.01 and tiny_codec.samples_per_frame == 1024
    assert tiny_codec.decode_features(codes).shape == (codes.shape[1] * 4, 80)


@pytest.mark.parametrize("chunk", [1, 2, 6])
def test_streamed_decoder_equals_offline(tiny_codec, fox_mel, chunk):
    codes = tiny_codec.encode_features(fox_mel)[:, :20]
    offline_mel = tiny_codec.decode_features(codes)
    state: dict = {}
    parts = [tiny_codec.decode_features(codes[:, i : i + chunk], state, final=False) for i in range(0, 20, chunk)]
    streamed_mel = np.concatenate(parts + [tiny_codec.decode_features(codes[:, :0], state, final=True)])
    assert np.abs(streamed_mel - offline_mel).max() < 1e-4
    assert len(parts[-1]) > 0 or chunk == 1  # frames leave before the utterance ends: one codec frame of lookahead
    first_out = next(i for i, part in enumerate(parts) if len(part)) * chunk + chunk
    assert first_out == max(chunk, tiny_codec.config.decoder_lookahead + 1)  # pushes of one: 2 with lookahead, 1 causal
    decoder = tiny_codec.streaming_decoder()
    audio = np.concatenate([decoder.push(codes[:, i : i + chunk]) for i in range(0, 20, chunk)] + [decoder.flush()])
    assert len(audio) == 20 * 1024
    assert np.abs(audio - tiny_codec.decode(codes)).max() < 1e-3


def test_stretch_renders_longer_audio(tiny_codec, fox_mel):
    codes = tiny_codec.encode_features(fox_mel)[:, :12]
    decoder = tiny_codec.streaming_decoder()
    audio = np.concatenate([decoder.push(codes[:, :6], stretch=1.5), decoder.push(codes[:, 6:], stretch=1.5), decoder.flush()])
    assert 1.3 * 12 * 1024 < len(audio) < 1.6 * 12 * 1024 and np.isfinite(audio).all()


def test_save_load_and_dispatch(tiny_codec, fox_mel, tmp_path):
    tiny_codec.save(tmp_path / "mel")
    assert json.loads((tmp_path / "mel" / "codec.json").read_text())["kind"] == "mel"
    loaded = load_codec(tmp_path / "mel")
    assert isinstance(loaded, MelCodec)
    same = loaded.encode_features(fox_mel) == tiny_codec.encode_features(fox_mel)
    assert same.float().mean() > 0.97  # fp16 weights: a code on a rounding boundary may flip, no more
    with pytest.raises(UserError):
        load_codec(tmp_path / "missing")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "codec.json").write_text('{"kind": "odd"}')
    with pytest.raises(ValueError, match="unknown codec kind"):
        load_codec(tmp_path / "odd")
    (tmp_path / "odd" / "codec.json").write_text('{"frames_per_code": 4}')  # no kind: one line naming the kinds
    with pytest.raises(UserError, match="unknown codec kind None"):
        load_codec(tmp_path / "odd")
    (tmp_path / "odd" / "codec.json").write_text('{"kind": "nemo"}')  # the NeMo adapter is selectable, and says what it needs
    with pytest.raises(UserError, match="names its model"):
        load_codec(tmp_path / "odd")
    (tmp_path / "odd" / "codec.json").write_text('{"kind": "nemo", "model": "absent.nemo"}')
    with pytest.raises(UserError, match="nemo"):  # no nemo extra, or no such file: one line either way
        load_codec(tmp_path / "odd")


@pytest.mark.slow
def test_training_lowers_the_loss(tmp_path):
    """Two short runs on a two-utterance corpus: the longer one fits the mel better, and checkpoints load."""
    from audio_io.wav import write_wav
    from tts.data.corpus import ManifestEntry, write_manifest
    from tts.training.mel_codec_train import MelCodecTrainConfig, train_mel_codec

    audio, _ = read_wav(FIXTURE)
    (tmp_path / "wavs").mkdir()
    write_wav(tmp_path / "wavs" / "a.wav", audio)
    write_wav(tmp_path / "wavs" / "b.wav", audio[::-1].copy())
    entries = [ManifestEntry(f"wavs/{n}.wav", "fox", len(audio) / 22050, "piper_joe") for n in "ab"]
    for split in ("train", "val"):
        write_manifest(tmp_path / f"{split}.jsonl", entries)
    config = MelCodecConfig(channels=32)
    logs = [train_mel_codec(tmp_path, config, MelCodecTrainConfig(minutes=minutes, batch=4, segment_frames=64),
                            checkpoint=tmp_path / f"codec{i}")[1] for i, minutes in enumerate((0.02, 0.5))]
    assert logs[1]["steps"] > logs[0]["steps"] and logs[1]["l1"] < logs[0]["l1"]
    assert (tmp_path / "mels" / "wavs" / "a.npy").exists()  # log-mel cached beside the corpus
    saved = load_codec(tmp_path / "codec1")
    assert isinstance(saved, MelCodec)

    # a new causal decoder for the saved codec: its encoder (the codes) stays, the decoder starts from the saved one
    from tts.training.mel_codec_train import decoder_from

    codes = saved.encode_features(mel.log_mel(audio))
    same = MelCodec(decoder_from(saved, 1)).decode_features(codes)
    assert np.array_equal(saved.decode_features(codes), same)  # the same lookahead: the same decoder
    recut = MelCodec(decoder_from(saved, 0))
    causal, log = train_mel_codec(tmp_path, MelCodecConfig(channels=32, decoder_lookahead=0),
                                  MelCodecTrainConfig(minutes=0.3, batch=4, segment_frames=64),
                                  checkpoint=tmp_path / "causal", decoder_of=saved)
    loaded = load_codec(tmp_path / "causal")
    assert loaded.config.decoder_lookahead == 0 and torch.equal(loaded.encode_features(mel.log_mel(audio)), codes)
    target = saved.pad_frames(mel.log_mel(audio))
    errors = [np.abs(c.decode_features(codes) - target).mean() for c in (recut, causal)]
    assert errors[1] < errors[0]  # training fits the causal decoder better than the copied taps


@pytest.mark.slow
def test_codec_bench_measures_the_round_trip(tiny_codec):
    """The bench on two spoken sentences: an untrained codec loses the words that Whisper hears in the original."""
    from tts.eval.codec_bench import run_codec_bench, voice_clips

    sentences = ["The quick brown fox jumps over the lazy dog.", "Please bring a warm sweater tonight."]
    result = run_codec_bench(tiny_codec, voice_clips(sentences))
    assert result["n"] == 2 and result["frame_rate"] == 21.53 and result["bitrate_bps"] == 1717
    assert result["wer_original"] <= 20 < result["wer_roundtrip"]
    assert result["decode_rtf"] > 0 and result["stream_decode_rtf"] > 0


def test_tokens_name_their_codec(tmp_path):
    from tts.data.tokens import record_codec, tokens_codec_dir

    assert tokens_codec_dir(tmp_path) == ""
    record_codec(tmp_path, "tts/assets/mel_codec")
    assert tokens_codec_dir(tmp_path) == "tts/assets/mel_codec"
    (tmp_path / "train-0000.npz").write_bytes(b"")
    record_codec(tmp_path, "tts/assets/mel_codec")  # the same codec may add shards
    with pytest.raises(ValueError, match="another codec"):
        record_codec(tmp_path, "")
