"""Offline speech corpus: local text -> teacher voices -> 22.05 kHz WAVs and JSONL manifests; readers for
LibriTTS- and HiFiTTS-style directories that write the same manifests."""
from __future__ import annotations

import glob
import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from audio_io.errors import UserError
from audio_io.wav import read_wav, write_wav
from tts.data.voices import APT_PACKAGES, SAMPLE_RATE, VOICES, SynthesisError, Utterance

FORTUNE_DIR = Path("/usr/share/games/fortunes")
SPLITS = ("train", "val", "test")


@dataclass
class ManifestEntry:
    audio_filepath: str  # relative to the manifest's folder, or absolute
    text: str
    duration: float
    speaker: str
    phoneme_alignments: list[tuple[str, int]] | None = None  # Piper: (phoneme, samples at 22.05 kHz)

    def to_json(self) -> str:
        data = asdict(self)
        if data["phoneme_alignments"] is None:
            del data["phoneme_alignments"]
        return json.dumps(data, ensure_ascii=False)


def read_manifest(path: Path) -> list[ManifestEntry]:
    entries = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            data = json.loads(line)
            entries.append(ManifestEntry(**{k: data.get(k) for k in ("audio_filepath", "text", "duration", "speaker", "phoneme_alignments")}))
    return entries


def write_manifest(path: Path, entries: list[ManifestEntry]) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text("".join(e.to_json() + "\n" for e in entries))
    tmp.replace(path)


def speaker_entries(corpus: Path, speaker: str, utterances: int, seed: int) -> list[ManifestEntry]:
    """`utterances` seeded train-split utterances of one speaker."""
    entries = [e for e in read_manifest(corpus / "train.jsonl") if e.speaker == speaker]
    if not entries:
        raise UserError(f"no {speaker} utterances in {corpus}/train.jsonl")
    random.Random(seed).shuffle(entries)
    return entries[:utterances]


def compact_corpus(source: Path, out: Path, speaker: str, utterances: int, seed: int = 0) -> dict[str, float]:
    """The utterances a vocoder trains on (`speaker_entries`) copied with FLAC audio (lossless, about half the WAVs'
    size) and their train.jsonl: a corpus to carry to a machine that cannot build one (a GPU without the voices)."""
    import numpy as np
    import soundfile

    entries = speaker_entries(source, speaker, utterances, seed)
    (out / "audio").mkdir(parents=True, exist_ok=True)
    copied = []
    for i, e in enumerate(entries):
        path = Path(e.audio_filepath)
        audio, rate = read_wav(path if path.is_absolute() else source / path)
        name = f"audio/{i:05d}.flac"
        soundfile.write(str(out / name), np.clip(audio, -1.0, 1.0), rate, subtype="PCM_16")
        copied.append(ManifestEntry(name, e.text, e.duration, e.speaker))
    write_manifest(out / "train.jsonl", copied)
    megabytes = sum(f.stat().st_size for f in (out / "audio").glob("*.flac")) / 1e6
    return {"utterances": len(copied), "hours": round(sum(e.duration for e in copied) / 3600, 3),
            "megabytes": round(megabytes, 1)}


# ---- text -------------------------------------------------------------------------------------------------------
def speakable_sentences(min_words: int = 3, max_words: int = 30, root: Path = FORTUNE_DIR) -> list[str]:
    """Sentences from the local fortune files: plain prose of min..max words, attributions removed, deduplicated,
    in a stable order."""
    seen: set[str] = set()
    out: list[str] = []
    for path in sorted(glob.glob(str(root / "*"))):
        if "." in os.path.basename(path) or os.path.isdir(path):
            continue
        text = Path(path).read_text(errors="ignore")
        for entry in text.split("\n%\n"):
            entry = re.split(r"\n\s*--", entry)[0]  # drop "-- Author" attributions
            entry = re.sub(r"\s+", " ", entry).strip()
            for sentence in re.split(r"(?<=[.!?])\s+", entry):
                if (min_words <= len(sentence.split()) <= max_words and sentence[-1] in ".!?"
                        and re.fullmatch(r"[A-Za-z0-9 ,.'!?;:$%-]+", sentence) and sentence not in seen):
                    seen.add(sentence)
                    out.append(sentence)
    return out


def sentence_split(sentence: str, val_percent: int = 2, test_percent: int = 2) -> str:
    """Stable split by the sentence itself, so a sentence is in one split for every voice and every run."""
    bucket = int(hashlib.sha1(sentence.encode()).hexdigest(), 16) % 100
    return "val" if bucket < val_percent else "test" if bucket < val_percent + test_percent else "train"


# ---- corpus build -----------------------------------------------------------------------------------------------
@dataclass
class CorpusConfig:
    hours: float = 5.0
    seed: int = 0
    voices: list[str] = field(default_factory=lambda: list(VOICES))
    held_out: list[str] = field(default_factory=lambda: ["flite_rms"])  # never in train/val/test: zero-shot only
    piper_share: float = 0.4  # the default voice gets this share of the hours
    held_out_share: float = 0.02
    workers: int = 2
    text_file: str = ""  # sentences to speak, one per line ('#' comments skipped); "" = Debian's fortunes


@dataclass
class VoiceJob:
    voice: str
    seconds: float
    splits: tuple[str, ...]
    seed: int
    out: str
    shard: int = 0  # a voice's sentences split over `shards` workers: this one takes every shards-th
    shards: int = 1
    text_file: str = ""  # "" = fortunes; otherwise the job speaks this file's sentences, under a name of its own

    @property
    def folder(self) -> str:
        """wavs/<folder>/: the voice, plus the text file's stem when it speaks one"""
        return self.voice + (f"-{Path(self.text_file).stem}" if self.text_file else "")

    @property
    def name(self) -> str:
        return self.folder if self.shards == 1 else f"{self.folder}-{self.shard}of{self.shards}"

    def sentences(self) -> list[str]:
        if not self.text_file:
            return speakable_sentences()
        lines = [l.strip() for l in Path(self.text_file).read_text().splitlines()]
        return list(dict.fromkeys(l for l in lines if l and not l.startswith("#")))


def plan_jobs(config: CorpusConfig, out: Path) -> list[VoiceJob]:
    missing = [v for v in config.voices if v not in VOICES]
    if missing:
        raise UserError(f"unknown voices: {', '.join(missing)} (known: {', '.join(VOICES)})")
    trained = [v for v in config.voices if v not in config.held_out]
    held = [v for v in config.voices if v in config.held_out]
    total = config.hours * 3600
    budget_held = total * config.held_out_share
    budget_trained = total - budget_held * len(held)
    jobs = []
    for v in trained:
        share = config.piper_share if v == "piper_joe" and len(trained) > 1 else None
        rest = (1 - config.piper_share) / max(1, len(trained) - ("piper_joe" in trained)) if share is None else share
        jobs.append(VoiceJob(v, budget_trained * (rest if len(trained) > 1 else 1.0), SPLITS, config.seed, str(out),
                             text_file=config.text_file))
    jobs += [VoiceJob(v, budget_held, ("test",), config.seed, str(out), text_file=config.text_file) for v in held]
    if len(jobs) < config.workers:  # fewer voices than workers (a single-voice corpus): split each voice
        jobs = [VoiceJob(j.voice, j.seconds / config.workers, j.splits, j.seed, j.out, shard, config.workers, j.text_file)
                for j in jobs for shard in range(config.workers)]
    return jobs


def _voice_progress(out: Path, job_name: str) -> Path:
    return out / "progress" / f"{job_name}.jsonl"


def run_voice_job(job: VoiceJob, report: Callable[[str, float], None] | None = None) -> None:
    """Synthesise sentences for one voice until its budget of seconds is reached; resumable (the progress file is
    appended after every utterance, and what it lists is skipped)."""
    out = Path(job.out)
    voice = VOICES[job.voice]
    progress_path = _voice_progress(out, job.name)
    done: dict[str, dict] = {}
    if progress_path.exists():
        for line in progress_path.read_text().splitlines():
            try:
                record = json.loads(line)
                done[record["audio_filepath"]] = record
            except json.JSONDecodeError:
                continue  # a line cut short by an interruption
    seconds = sum(r["duration"] for r in done.values())
    if report:
        report(job.name, seconds)
    if seconds >= job.seconds:
        return
    sentences = [s for s in job.sentences() if sentence_split(s) in job.splits]
    random.Random(f"{job.seed}-{job.voice}").shuffle(sentences)
    (out / "wavs" / job.folder).mkdir(parents=True, exist_ok=True)
    with progress_path.open("a") as log:
        for index, sentence in enumerate(sentences):
            if seconds >= job.seconds:
                break
            if index % job.shards != job.shard:
                continue
            rel = f"wavs/{job.folder}/{index:06d}.wav"
            if rel in done:
                continue
            try:
                utterance: Utterance = voice.synthesize(sentence)
            except (SynthesisError, subprocess.TimeoutExpired):
                continue  # a sentence the engine refuses is skipped, not fatal
            duration = len(utterance.audio) / SAMPLE_RATE
            if duration < 0.5:
                continue
            write_wav(out / rel, utterance.audio)
            entry = ManifestEntry(rel, sentence, round(duration, 3), job.voice, utterance.phoneme_alignments)
            log.write(entry.to_json() + "\n")
            log.flush()
            seconds += duration
            if report:
                report(job.name, seconds)


def _worker(job: VoiceJob, queue) -> None:
    run_voice_job(job, lambda name, seconds: queue.put((name, seconds)))
    queue.put((job.name, None))


def build_corpus(config: CorpusConfig, out: Path, progress=None) -> dict[str, int]:
    """Build (or resume) the corpus in `out`; returns the number of utterances per manifest."""
    out = Path(out)
    (out / "progress").mkdir(parents=True, exist_ok=True)
    jobs = plan_jobs(config, out)  # refuses unknown voices
    unavailable = [v for v in config.voices if not VOICES[v].available()]
    if unavailable:
        raise UserError(f"voices not installed: {', '.join(unavailable)}; install them with: apt-get install -y {APT_PACKAGES}")
    (out / "corpus.json").write_text(json.dumps(asdict(config), indent=1))
    tasks = {j.name: progress.add_task(j.name, total=j.seconds) for j in jobs} if progress else {}
    ctx = mp.get_context("spawn")
    queue = ctx.Manager().Queue()
    with ctx.Pool(config.workers) as pool:
        results = [pool.apply_async(_worker, (job, queue)) for job in jobs]
        finished = 0
        while finished < len(jobs):
            voice, seconds = queue.get()
            if seconds is None:
                finished += 1
            elif progress:
                progress.update(tasks[voice], completed=min(seconds, progress.tasks[tasks[voice]].total))
        for r in results:
            r.get()
    return write_corpus_manifests(out, config.held_out)


def write_corpus_manifests(out: Path, held_out: list[str]) -> dict[str, int]:
    entries = []
    for path in sorted((out / "progress").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                entries.append(ManifestEntry(**json.loads(line)))
            except (json.JSONDecodeError, TypeError):
                continue
    groups: dict[str, list[ManifestEntry]] = {name: [] for name in (*SPLITS, "zeroshot")}
    for e in entries:
        groups["zeroshot" if e.speaker in held_out else sentence_split(e.text)].append(e)
    for name, group in groups.items():
        write_manifest(out / f"{name}.jsonl", group)
    return {name: len(group) for name, group in groups.items()}


# ---- external corpora -------------------------------------------------------------------------------------------
def read_libritts(root: Path) -> Iterator[ManifestEntry]:
    """LibriTTS layout: SUBSET/SPEAKER/CHAPTER/SPEAKER_CHAPTER_*.wav with .normalized.txt beside each."""
    for wav in sorted(Path(root).rglob("*.wav")):
        text_file = wav.with_suffix(".normalized.txt")
        if not text_file.exists():
            text_file = wav.with_suffix(".original.txt")
        if not text_file.exists():
            continue
        audio, rate = read_wav(wav)
        yield ManifestEntry(str(wav.resolve()), text_file.read_text().strip(), round(len(audio) / rate, 3), f"libritts_{wav.name.split('_')[0]}")


def read_hifitts(root: Path) -> Iterator[ManifestEntry]:
    """HiFiTTS layout: SPEAKER_manifest_*.json (JSONL with audio_filepath, text or text_normalized, duration)."""
    for manifest in sorted(Path(root).glob("*_manifest_*.json")):
        speaker = manifest.name.split("_manifest_")[0]
        for line in manifest.read_text().splitlines():
            if not line.strip():
                continue
            data = json.loads(line)
            path = Path(data["audio_filepath"])
            path = path if path.is_absolute() else (Path(root) / path)
            text = data.get("text_normalized") or data.get("text", "")
            yield ManifestEntry(str(path.resolve()), text, float(data["duration"]), f"hifitts_{speaker}")


def import_corpus(kind: str, root: Path, out: Path) -> dict[str, int]:
    """LibriTTS/HiFiTTS directory -> train/val/test manifests in `out` (split by sentence, as built corpora)."""
    reader = {"libritts": read_libritts, "hifitts": read_hifitts}[kind]
    Path(out).mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[ManifestEntry]] = {name: [] for name in SPLITS}
    for entry in reader(Path(root)):
        groups[sentence_split(entry.text)].append(entry)
    for name, group in groups.items():
        write_manifest(Path(out) / f"{name}.jsonl", group)
    return {name: len(group) for name, group in groups.items()}
