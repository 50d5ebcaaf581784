import json
import wave

import numpy as np
import pytest

from audio_io.wav import write_wav
from tts.data.corpus import (
    CorpusConfig,
    build_corpus,
    import_corpus,
    plan_jobs,
    read_manifest,
    sentence_split,
    speakable_sentences,
)
from tts.data.tokens import piper_frame_words
from tts.data.voices import VOICES

VOICE_SET = ["piper_joe", "flite_kal", "espeak_us_m", "flite_slt"]


def _build(out, hours=0.015):
    config = CorpusConfig(hours=hours, seed=3, voices=VOICE_SET, held_out=["flite_slt"], held_out_share=0.1)
    return build_corpus(config, out)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    counts = _build(out)
    return out, counts


def test_sentences_are_speakable_and_stable():
    sentences = speakable_sentences()
    assert len(sentences) > 5000
    assert all(3 <= len(s.split()) <= 30 for s in sentences[:2000])
    assert sentences[:50] == speakable_sentences()[:50]


def test_corpus_manifests(corpus):
    out, counts = corpus
    assert counts["train"] > 0 and counts["zeroshot"] > 0
    all_entries = {name: read_manifest(out / f"{name}.jsonl") for name in ("train", "val", "test", "zeroshot")}
    speakers_in_training = {e.speaker for name in ("train", "val", "test") for e in all_entries[name]}
    assert "flite_slt" not in speakers_in_training  # held out entirely
    assert {e.speaker for e in all_entries["zeroshot"]} == {"flite_slt"}
    assert speakers_in_training == {"piper_joe", "flite_kal", "espeak_us_m"}
    # split by sentence: no text in two splits
    texts = {name: {e.text for e in entries} for name, entries in all_entries.items() if name != "zeroshot"}
    assert not (texts["train"] & texts["val"]) and not (texts["train"] & texts["test"])
    for name, entries in all_entries.items():
        for e in entries[:5]:
            with wave.open(str(out / e.audio_filepath)) as f:
                assert f.getframerate() == 22050 and f.getnchannels() == 1
                assert abs(f.getnframes() / 22050 - e.duration) < 0.01
            assert sentence_split(e.text) == name or name == "zeroshot"
    piper = [e for e in all_entries["train"] + all_entries["val"] + all_entries["test"] if e.speaker == "piper_joe"]
    assert piper and all(e.phoneme_alignments for e in piper)
    first = piper[0]
    assert abs(sum(n for _, n in first.phoneme_alignments) / 22050 - first.duration) < 0.05


def test_corpus_is_deterministic_and_resumable(corpus, tmp_path):
    out, counts = corpus
    # resume: remove one voice's last utterances and the manifests, build again -> the same corpus
    progress = out / "progress" / "flite_kal.jsonl"
    lines = progress.read_text().splitlines()
    progress.write_text("\n".join(lines[:-2]) + "\n")
    before = (out / "train.jsonl").read_text()
    assert _build(out) == counts
    assert sorted((out / "train.jsonl").read_text().splitlines()) == sorted(before.splitlines())
    # a fresh build with the same seed picks the same sentences for a voice
    again = tmp_path / "again"
    config = CorpusConfig(hours=0.004, seed=3, voices=["espeak_us_m"], held_out=[], workers=1)
    build_corpus(config, again)
    first_text = json.loads((again / "progress" / "espeak_us_m.jsonl").read_text().splitlines()[0])["text"]
    original = json.loads((out / "progress" / "espeak_us_m.jsonl").read_text().splitlines()[0])["text"]
    assert first_text == original


def test_a_single_voice_corpus_is_split_over_the_workers(tmp_path):
    """One voice and two workers: two jobs with half the budget each, taking alternate sentences, so no sentence is
    spoken twice and both cores work."""
    jobs = plan_jobs(CorpusConfig(hours=1.0, voices=["piper_joe"], held_out=[], workers=2), tmp_path)
    assert [(j.voice, j.shard, j.shards) for j in jobs] == [("piper_joe", 0, 2), ("piper_joe", 1, 2)]
    assert sum(j.seconds for j in jobs) == 3600 and len({j.name for j in jobs}) == 2
    build_corpus(CorpusConfig(hours=0.006, voices=["espeak_us_m"], held_out=[], workers=2), tmp_path)
    texts = [[json.loads(line)["text"] for line in (tmp_path / "progress" / f"espeak_us_m-{i}of2.jsonl").read_text().splitlines()]
             for i in range(2)]
    assert texts[0] and texts[1] and not set(texts[0]) & set(texts[1])
    assert len(read_manifest(tmp_path / "train.jsonl")) + len(read_manifest(tmp_path / "val.jsonl")) + \
        len(read_manifest(tmp_path / "test.jsonl")) == len(texts[0]) + len(texts[1])


def test_a_text_file_adds_its_sentences_to_the_corpus(tmp_path):
    text = tmp_path / "replies.txt"
    text.write_text("# a comment\nSure, I can help with that today.\nThe train leaves at seven.\n\nSure, I can help with that today.\n")
    counts = build_corpus(CorpusConfig(hours=0.1, voices=["espeak_us_m"], held_out=[], workers=1, text_file=str(text)), tmp_path)
    entries = [e for name in ("train", "val", "test") for e in read_manifest(tmp_path / f"{name}.jsonl")]
    assert sorted(e.text for e in entries) == ["Sure, I can help with that today.", "The train leaves at seven."]
    assert all(e.audio_filepath.startswith("wavs/espeak_us_m-replies/") for e in entries) and sum(counts.values()) == 2


def test_unknown_voice_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown voices: nope"):
        build_corpus(CorpusConfig(hours=0.01, voices=["nope"]), tmp_path)


def test_libritts_and_hifitts_readers(tmp_path):
    tone = (0.1 * np.sin(np.arange(24000) / 10)).astype(np.float32)
    lib = tmp_path / "LibriTTS" / "train-clean-100" / "19" / "198"
    lib.mkdir(parents=True)
    for i, text in enumerate(["The first sentence here.", "A second one follows it."]):
        write_wav(lib / f"19_198_00000{i}_00000{i}.wav", tone, 24000)
        (lib / f"19_198_00000{i}_00000{i}.normalized.txt").write_text(text)
    counts = import_corpus("libritts", tmp_path / "LibriTTS", tmp_path / "lib_out")
    entries = [e for name in ("train", "val", "test") for e in read_manifest(tmp_path / "lib_out" / f"{name}.jsonl")]
    assert sum(counts.values()) == 2 and {e.speaker for e in entries} == {"libritts_19"}
    assert all(abs(e.duration - 1.0) < 1e-3 for e in entries)

    hifi = tmp_path / "hifitts"
    (hifi / "audio" / "92_clean").mkdir(parents=True)
    write_wav(hifi / "audio" / "92_clean" / "a.wav", tone, 44100)
    (hifi / "92_manifest_clean_train.json").write_text(json.dumps(
        {"audio_filepath": "audio/92_clean/a.wav", "text": "Hello World", "text_normalized": "hello world", "duration": 0.54}) + "\n")
    counts = import_corpus("hifitts", hifi, tmp_path / "hifi_out")
    entries = [e for name in ("train", "val", "test") for e in read_manifest(tmp_path / "hifi_out" / f"{name}.jsonl")]
    assert len(entries) == 1 and entries[0].speaker == "hifitts_92" and entries[0].text == "hello world"
    assert (tmp_path / "hifi_out" / "train.jsonl").exists()


def test_piper_frame_words():
    alignments = [("^", 512), ("h", 512), ("i", 512), (" ", 256), ("j", 512), ("o", 768), ("$", 256)]
    words = piper_frame_words(alignments, 2, 512, 6)
    assert words.tolist() == [1, 1, 1, 2, 2, 2]
    assert piper_frame_words(alignments, 3, 512, 6) is None


def test_every_voice_speaks():
    for voice in VOICES.values():
        audio = voice.synthesize("Testing one two.").audio
        assert audio.dtype == np.float32 and 0.3 < len(audio) / 22050 < 5 and 0.5 < np.abs(audio).max() <= 0.91


def test_cached_fp16_computes_once_and_keeps_fp16(tmp_path):
    from tts.data.features import cached_fp16

    calls = []

    def compute():
        calls.append(1)
        return np.array([1.0, 1.0 / 3], dtype=np.float32)

    path = tmp_path / "sub" / "x.npy"
    first = cached_fp16(path, compute)
    again = cached_fp16(path, compute)
    assert len(calls) == 1 and again.dtype == np.float32
    assert np.allclose(again, first, atol=1e-3) and np.load(path).dtype == np.float16
    assert not list(path.parent.glob("*.tmp.npy"))
