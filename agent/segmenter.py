"""LLM pieces to words: a word is complete once whitespace follows it (one piece of lookahead); `flush()` at the
end of the reply releases the last one. Words keep their punctuation and know whether they start a line (the
normaliser needs that for bullets and headings)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from tts.frontend.text import TextNormalizer
from tts.inference.stream_parts import SEGMENT_BREAK

WORD_THEN_SPACE = re.compile(r"(\s*)(\S+)(?=\s)")


@dataclass
class Word:
    text: str
    line_start: bool
    t_ns: int  # when the word became complete


class WordSegmenter:
    def __init__(self) -> None:
        self.buffer = ""
        self.at_line_start = True

    def push(self, piece: str, t_ns: int) -> list[Word]:
        self.buffer += piece
        words = []
        while match := WORD_THEN_SPACE.match(self.buffer):
            words.append(self._word(match.group(1), match.group(2), t_ns))
            self.buffer = self.buffer[match.end() :]
        return words

    def flush(self, t_ns: int) -> list[Word]:
        """End of the reply: whatever is left is the last word (if any)."""
        rest, self.buffer = self.buffer, ""
        match = re.match(r"(\s*)(\S+)", rest)
        return [self._word(match.group(1), match.group(2), t_ns)] if match else []

    def _word(self, lead: str, text: str, t_ns: int) -> Word:
        if "\n" in lead:
            self.at_line_start = True
        word = Word(text, self.at_line_start, t_ns)
        self.at_line_start = False
        return word


class SpokenWords:
    """Text as it streams -> the words the voice speaks, in order: words cut at whitespace, normalised (numbers,
    symbols, markdown; code blocks skipped), with `SEGMENT_BREAK` where a skipped code block opens (its many
    tokens would otherwise stall the words before it, which wait for lookahead words after it). `said` learns
    which written word each spoken word came from. One per reply; the orchestrator and the framework adapters
    (`agent/integrations/`) share it."""

    def __init__(self, said=None):
        self.segmenter, self.normalizer, self.said = WordSegmenter(), TextNormalizer(), said

    def push(self, piece: str, t_ns: int) -> list[str]:
        return self._speak(self.segmenter.push(piece, t_ns))

    def flush(self, t_ns: int) -> list[str]:
        """The end of the text: the last word."""
        return self._speak(self.segmenter.flush(t_ns))

    def _speak(self, words: list[Word]) -> list[str]:
        out: list[str] = []
        for word in words:
            in_code = self.normalizer.in_code_block
            if self.said is not None:
                self.said.wrote(word.text)
            for spoken in self.normalizer.push(word.text, word.line_start):
                if self.said is not None:
                    self.said.spoke()
                out.append(spoken)
            if self.normalizer.in_code_block and not in_code:
                out.append(SEGMENT_BREAK)
        return out
