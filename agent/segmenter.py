"""LLM pieces to words: a word is complete once whitespace follows it (one piece of lookahead); `flush()` at the
end of the reply releases the last one. Words keep their punctuation and know whether they start a line (the
normaliser needs that for bullets and headings)."""
from __future__ import annotations

import re
from dataclasses import dataclass

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
