"""Tokenised corpus for training: per utterance phoneme ids per word, codec codes, speaker, and (for Piper
utterances) the word of every codec frame from Piper's exact phoneme durations. Sharded .npz, resumable."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audio_io.errors import UserError
from tts.codec.load import Codec
from tts.data.corpus import read_manifest
from tts.data.features import corpus_codes
from tts.frontend.g2p import G2P

SHARD_SIZE = 500


@dataclass
class TokenizedUtterance:
    text: str
    speaker: str
    words: list[list[int]]  # phoneme ids per word
    codes: np.ndarray  # (K, T) int16
    frame_words: np.ndarray | None  # (T,) 1-based word per frame, from Piper durations


def piper_frame_words(alignments: list, n_words: int, samples_per_frame: int, n_frames: int) -> np.ndarray | None:
    """Word per codec frame from Piper's (phoneme, samples) list: words are separated by ' ' entries. None when
    Piper's word count differs from ours (then MAS aligns the utterance)."""
    word_ends, position, word_count = [], 0, 0
    for phoneme, samples in alignments:
        if phoneme == " " and position > 0:
            word_ends.append(position)
        position += int(samples)
    word_ends.append(position)
    word_count = len(word_ends)
    if word_count != n_words:
        return None
    centers = (np.arange(n_frames) + 0.5) * samples_per_frame
    return (np.searchsorted(np.array(word_ends), centers, side="right") + 1).clip(1, n_words).astype(np.int16)


def tokenize_manifest(
    corpus: Path, manifest: str, codec: Codec, out: Path, g2p: G2P, progress=None, speakers: list[str] | None = None
) -> int:
    """manifest (optionally only some speakers) -> out/MANIFEST-NNNN.npz shards (existing shards are kept)."""
    entries = [e for e in read_manifest(corpus / f"{manifest}.jsonl") if speakers is None or e.speaker in speakers]
    out.mkdir(parents=True, exist_ok=True)
    shards = range(0, len(entries), SHARD_SIZE)
    task = progress.add_task(f"codes {manifest}", total=len(entries)) if progress else None
    for shard_index, start in enumerate(shards):
        path = out / f"{manifest}-{shard_index:04d}.npz"
        chunk = entries[start : start + SHARD_SIZE]
        if not path.exists():
            utterances = []
            for e in chunk:
                words, ids = g2p.encode_text(e.text)
                if not ids:
                    continue
                codes = corpus_codes(codec, corpus, e.audio_filepath).numpy().astype(np.int16)
                frame_words = None
                if e.phoneme_alignments:
                    frame_words = piper_frame_words(e.phoneme_alignments, len(ids), codec.samples_per_frame, codes.shape[1])
                utterances.append(TokenizedUtterance(e.text, e.speaker, ids, codes, frame_words))
                if progress:
                    progress.advance(task)
            save_shard(path, utterances)
        elif progress:
            progress.advance(task, len(chunk))
    return len(entries)


def record_codec(out: Path, codec_dir: str) -> None:
    """Tokens name the codec that made them (out/codec.json), so training and exports know how to decode them."""
    out.mkdir(parents=True, exist_ok=True)
    if any(out.glob("*.npz")) and tokens_codec_dir(out) != codec_dir:
        raise UserError(f"{out} holds tokens of another codec ({tokens_codec_dir(out) or 'the default'}); use a new folder")
    (out / "codec.json").write_text(json.dumps({"codec_dir": codec_dir}) + "\n")


def tokens_codec_dir(directory: Path) -> str:
    """The codec folder recorded with tokenised data ("" when none was: the shipped default)."""
    path = Path(directory) / "codec.json"
    return json.loads(path.read_text()).get("codec_dir", "") if path.exists() else ""


def save_shard(path: Path, utterances: list[TokenizedUtterance]) -> None:
    meta = [{"text": u.text, "speaker": u.speaker, "word_lens": [len(w) for w in u.words],
             "frames": int(u.codes.shape[1]), "has_frame_words": u.frame_words is not None} for u in utterances]
    tokens = np.array([t for u in utterances for w in u.words for t in w], dtype=np.int16)
    codes = np.concatenate([u.codes for u in utterances], axis=1) if utterances else np.zeros((8, 0), np.int16)
    frame_words = np.concatenate([u.frame_words if u.frame_words is not None else np.zeros(u.codes.shape[1], np.int16) for u in utterances]) if utterances else np.zeros(0, np.int16)
    tmp = path.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, meta=np.array(json.dumps(meta)), tokens=tokens, codes=codes, frame_words=frame_words)
    tmp.replace(path)


def load_shard(path: Path) -> list[TokenizedUtterance]:
    data = np.load(path)
    meta = json.loads(str(data["meta"]))
    tokens, codes, frame_words = data["tokens"], data["codes"], data["frame_words"]
    out, t_pos, f_pos = [], 0, 0
    for m in meta:
        words = []
        for n in m["word_lens"]:
            words.append(tokens[t_pos : t_pos + n].astype(int).tolist())
            t_pos += n
        T = m["frames"]
        out.append(TokenizedUtterance(m["text"], m["speaker"], words, codes[:, f_pos : f_pos + T],
                                      frame_words[f_pos : f_pos + T] if m["has_frame_words"] else None))
        f_pos += T
    return out


def load_tokenized(directory: Path, manifest: str) -> list[TokenizedUtterance]:
    return [u for path in sorted(Path(directory).glob(f"{manifest}-*.npz")) for u in load_shard(path)]
