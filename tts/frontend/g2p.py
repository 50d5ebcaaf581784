"""G2P with phonemizer (espeak-ng): spoken words -> IPA symbol tokens per word, and the stable symbol table.

Words are phonemised one by one, in training data as in streaming. espeak's whole-sentence mode is not usable
for streaming: it joins function words into one phonological word ("on the") and reduces them by the *next*
word, which a word-by-word stream cannot know, so a model trained on it would meet other inputs at inference.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from tts.frontend.text import SPOKEN_PUNCTUATION, TextNormalizer
from tts.model.batch import TEXT_BOS, TEXT_EOS, TEXT_PAD

log = logging.getLogger(__name__)

SPECIALS = ["<pad>", "<bos>", "<eos>"]
# Every character espeak-ng en-us produced over ~39k words of local text, then common IPA for other accents
IPA_SYMBOLS = list("abdefhijklmnoprstuvwxzæðŋɐɑɔəɚɛɜɡɪɬɹɾʃʊʌʒʔˈˌːθᵻ") + ["\u0329", "\u0303"] + list(
    "cgqyçøœɒɘɨʉɯɤʎɲɕʑʁʀɣχβɸʋɥɫɭɳʂʐɖʈɟɢʕħʍɺʲʰʷ˞ɝɵɞɶʏʙʜʝʟɦɮɰɱɴɻɽʄʛʡʢǀǁǂǃ"
)


@dataclass
class SymbolTable:
    """Phoneme symbol <-> id. Saved with every checkpoint; ids never change for a given table."""
    symbols: list[str]

    @classmethod
    def default(cls) -> "SymbolTable":
        table = cls(SPECIALS + list(SPOKEN_PUNCTUATION) + IPA_SYMBOLS)
        assert table.symbols.index("<pad>") == TEXT_PAD and table.symbols.index("<bos>") == TEXT_BOS
        assert table.symbols.index("<eos>") == TEXT_EOS and len(set(table.symbols)) == len(table.symbols)
        return table

    def __post_init__(self) -> None:
        self.index = {s: i for i, s in enumerate(self.symbols)}

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, symbols: list[str]) -> list[int]:
        ids = []
        for s in symbols:
            if s in self.index:
                ids.append(self.index[s])
            else:
                log.warning("dropped phoneme symbol %r that is not in the symbol table", s)
        return ids

    def decode(self, ids: list[int]) -> list[str]:
        return [self.symbols[i] for i in ids]

    def save(self, path: Path) -> None:
        Path(path).write_text(json.dumps({"symbols": self.symbols}, ensure_ascii=False, indent=0))

    @classmethod
    def load(cls, path: Path) -> "SymbolTable":
        return cls(json.loads(Path(path).read_text())["symbols"])


def split_punctuation(word: str) -> tuple[str, list[str]]:
    """'world!' -> ('world', ['!'])"""
    core = word.rstrip(SPOKEN_PUNCTUATION + "…")
    return core, [c for c in word[len(core):].replace("…", ".") if c in SPOKEN_PUNCTUATION]


class G2P:
    """One espeak backend per process (start-up is the cost); per-word results are cached. The backend is not
    thread-safe (two sessions of `s5 serve` phonemizing at once got each other's lines), so calls take a lock."""

    def __init__(self, language: str = "en-us", symbols: SymbolTable | None = None):
        from phonemizer.backend import EspeakBackend

        logging.getLogger("phonemizer").setLevel(logging.ERROR)
        self.symbols = symbols or SymbolTable.default()
        self._backend = EspeakBackend(language, with_stress=True, language_switch="remove-flags")
        self._cache: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def _phonemize(self, cores: list[str]) -> None:
        from phonemizer.separator import Separator

        with self._lock:
            todo = sorted({c for c in cores if c and c not in self._cache})
            if not todo:
                return
            out = self._backend.phonemize(todo, separator=Separator(phone="", word=" "), strip=True, njobs=1)
            for core, ipa in zip(todo, out):
                self._cache[core] = [ch for ch in ipa if not ch.isspace()]

    def word_symbols(self, words: list[str]) -> list[list[str]]:
        """Spoken words (punctuation attached) -> IPA symbols per word, punctuation marks as their own symbols."""
        split = [split_punctuation(w) for w in words]
        self._phonemize([core for core, _ in split])
        return [(self._cache.get(core, []) if core else []) + marks for core, marks in split]

    def encode_words(self, words: list[str]) -> list[list[int]]:
        """Spoken words -> symbol ids per word (unknown symbols dropped with a warning)."""
        return [self.symbols.encode(symbols) for symbols in self.word_symbols(words)]

    def encode_text(self, text: str) -> tuple[list[str], list[list[int]]]:
        """Raw (LLM) text -> its spoken words and their ids; words without any symbol are dropped."""
        words = TextNormalizer().normalize(text)
        ids = self.encode_words(words)
        kept = [(w, i) for w, i in zip(words, ids) if i]
        return [w for w, _ in kept], [i for _, i in kept]
