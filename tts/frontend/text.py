"""LLM text to speakable words.

The normaliser reads one whitespace-separated piece at a time and looks only at what came before it (units after
a number, the day after a month, code fences), so feeding a reply word by word as an LLM streams it gives exactly
the words that normalising the whole reply gives. Punctuation stays attached to the word it follows.
"""
from __future__ import annotations

import logging
import re
import unicodedata
from dataclasses import dataclass, field
from fractions import Fraction

import emoji
from num2words import num2words
from unidecode import unidecode

log = logging.getLogger(__name__)

SPOKEN_PUNCTUATION = ".,!?;:"
ABBREVIATIONS = {
    "dr.": "doctor", "mr.": "mister", "mrs.": "missus", "ms.": "miz", "prof.": "professor", "st.": "saint",
    "jr.": "junior", "sr.": "senior", "e.g.": "for example", "i.e.": "that is", "etc.": "et cetera",
    "vs.": "versus", "vs": "versus", "approx.": "approximately", "dept.": "department", "min.": "minutes",
    "no.": "number", "jan.": "january", "feb.": "february", "mar.": "march", "apr.": "april", "aug.": "august",
    "sep.": "september", "sept.": "september", "oct.": "october", "nov.": "november", "dec.": "december",
}
# abbreviations whose own period also ends the sentence keep a period: "etc." at the end of a line
SENTENCE_FINAL_ABBREVIATIONS = {"etc."}
UNITS = {  # unit -> (singular, plural); only read as a unit right after a number
    "km": ("kilometer", "kilometers"), "m": ("meter", "meters"), "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"), "kg": ("kilogram", "kilograms"), "g": ("gram", "grams"),
    "mg": ("milligram", "milligrams"), "l": ("liter", "liters"), "ml": ("milliliter", "milliliters"),
    "mi": ("mile", "miles"), "ft": ("foot", "feet"), "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"),
    "oz": ("ounce", "ounces"), "mph": ("mile per hour", "miles per hour"), "km/h": ("kilometer per hour", "kilometers per hour"),
    "kb": ("kilobyte", "kilobytes"), "mb": ("megabyte", "megabytes"), "gb": ("gigabyte", "gigabytes"),
    "tb": ("terabyte", "terabytes"), "hz": ("hertz", "hertz"), "khz": ("kilohertz", "kilohertz"),
    "mhz": ("megahertz", "megahertz"), "ghz": ("gigahertz", "gigahertz"), "w": ("watt", "watts"),
    "kw": ("kilowatt", "kilowatts"), "v": ("volt", "volts"), "ms": ("millisecond", "milliseconds"),
    "s": ("second", "seconds"), "sec": ("second", "seconds"), "h": ("hour", "hours"), "hr": ("hour", "hours"),
    "hrs": ("hour", "hours"), "min": ("minute", "minutes"), "°c": ("degree celsius", "degrees celsius"),
    "°f": ("degree fahrenheit", "degrees fahrenheit"), "°": ("degree", "degrees"),
}
CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
              "£": ("pound", "pounds", "penny", "pence"), "¥": ("yen", "yen", "sen", "sen")}
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december"]
SYMBOL_WORDS = {"&": "and", "+": "plus", "=": "equals", "@": "at", "%": "percent", "#": "number"}
SCALE = {"k": "thousand", "m": "million", "b": "billion", "bn": "billion", "t": "trillion"}
POWERS = {2: "squared", 3: "cubed"}
DENOMINATORS = {2: ("half", "halves"), 4: ("quarter", "quarters")}


def numeric_char_words(c: str) -> str | None:
    """A digit-like character outside ASCII, as text the rest of the normaliser reads: a decimal digit of another
    script becomes the ASCII digit (numbers keep their value); a sub- or superscript, circled or vulgar-fraction
    character becomes words between spaces (H₂O -> "H two O", mc² -> "mc squared", ½ -> "one half",
    ④ -> "four"). None for anything else."""
    if c.isascii() or unicodedata.numeric(c, None) is None:
        return None
    if unicodedata.category(c) == "Nd":
        return str(unicodedata.digit(c))
    value = unicodedata.numeric(c)
    if "SUPERSCRIPT" in unicodedata.name(c, ""):
        return f" {POWERS.get(int(value), 'to the power of ' + num2words(int(value)))} "
    if value == int(value):
        return f" {num2words(int(value))} "
    fraction = Fraction(value).limit_denominator(1000)
    one, many = DENOMINATORS.get(fraction.denominator, (num2words(fraction.denominator, to="ordinal"),) * 2)
    many = many if fraction.denominator in DENOMINATORS else many + "s"
    return f" {num2words(fraction.numerator)} {one if fraction.numerator == 1 else many} "

NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
RE_NUMBER = re.compile(rf"^{NUMBER}$")
RE_CURRENCY = re.compile(r"^(-?)([$€£¥])(\d[\d,]*(?:\.\d+)?)(k|m|bn|b|t)?$", re.I)
RE_PERCENT = re.compile(rf"^({NUMBER})%$")
RE_TIME = re.compile(r"^(\d{1,2}):(\d{2})(?::\d{2})?(am|pm|a\.m\.|p\.m\.)?$", re.I)
RE_ISO_DATE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})$")
RE_ORDINAL = re.compile(r"^(\d+)(st|nd|rd|th)$", re.I)
RE_NUMBER_UNIT = re.compile(rf"^({NUMBER})([a-zA-Z°/]+)$")
RE_RANGE = re.compile(rf"^({NUMBER})[-–]({NUMBER})$")
RE_FRACTION = re.compile(r"^(\d+)/(\d+)$")
RE_URL = re.compile(r"^(?:https?://|www\.)\S+$", re.I)
RE_EMAIL = re.compile(r"^[\w.+-]+@[\w-]+(?:\.[\w-]+)+$")
RE_LIST_MARKER = re.compile(r"^(?:[-*+•]|\d+[.)])$")


def _plain_number(text: str) -> float | int:
    text = text.replace(",", "")
    return float(text) if "." in text else int(text)


def number_words(text: str) -> str:
    """Cardinal reading; four-digit integers from 1100 to 2099 read as years ("nineteen ninety")."""
    value = _plain_number(text)
    if isinstance(value, int) and "," not in text and 1100 <= value <= 2099 and len(text) == 4 and value % 1000 >= 10:
        return num2words(value, to="year")
    return num2words(value)


def _spoken(text: str) -> list[str]:
    """Split a phrase into words, hyphens of num2words ("twenty-one") become spaces."""
    return text.replace("-", " ").replace(",", "").split()


@dataclass
class TextNormalizer:
    """Stateful over one reply: code fences and the previous piece carry over; `reset()` between replies."""
    in_code_block: bool = False
    previous: str = ""  # the previous piece's core, lower-cased, for units and dates
    dropped: list[str] = field(default_factory=list)  # characters dropped as unspeakable

    def reset(self) -> None:
        self.in_code_block, self.previous, self.dropped = False, "", []

    def push(self, piece: str, line_start: bool = False) -> list[str]:
        """One whitespace-free piece of text -> zero or more spoken words (punctuation attached)."""
        if piece.startswith("```") or piece.startswith("~~~"):
            fence_closed_inline = len(piece) > 6 and piece.endswith(piece[:3]) and not self.in_code_block
            if not fence_closed_inline:
                self.in_code_block = not self.in_code_block
            self.previous = ""
            return []
        if self.in_code_block:
            return []
        if line_start and (RE_LIST_MARKER.match(piece) or piece.startswith("#") and set(piece) == {"#"}):
            return []  # list bullets and heading marks are layout, not speech
        words = self._piece(piece)
        return words

    def normalize(self, text: str) -> list[str]:
        """A whole text, as if streamed piece by piece."""
        words: list[str] = []
        for line in text.splitlines():
            for i, piece in enumerate(line.split()):
                words += self.push(piece, line_start=i == 0)
        return words

    # ---- one piece -------------------------------------------------------------------------------------------
    def _piece(self, piece: str) -> list[str]:
        piece = emoji.replace_emoji(piece, replace="")
        if not piece.isascii():
            piece = "".join(numeric_char_words(c) or c for c in piece)
        piece = piece.strip("*_~`>#|")  # markdown emphasis, inline code, quotes, headings, table bars
        if not piece:
            return []
        lowered = piece.lower()
        if lowered in ABBREVIATIONS:
            self.previous = lowered
            words = ABBREVIATIONS[lowered].split()
            return words[:-1] + [words[-1] + "."] if lowered in SENTENCE_FINAL_ABBREVIATIONS else words
        if RE_URL.match(piece.rstrip(".,!?;:)")):
            return self._url(piece)
        if RE_EMAIL.match(piece.rstrip(".,!?;:)")):
            return self._email(piece)
        core, tail = self._split_punctuation(piece)
        if not core:
            self.previous = ""
            return []
        words = self._core(core)
        self.previous = core.lower()
        if words and tail:
            words[-1] += tail
        return words

    def _split_punctuation(self, piece: str) -> tuple[str, str]:
        """Strip quotes and brackets; keep the last speakable punctuation mark to attach to the final word."""
        match = re.match(r"^[\"'“”‘’(\[{«]*(.*?)([\"'“”‘’)\]}».,!?;:…]*)$", piece)
        assert match is not None
        core, trailing = match.group(1), match.group(2)
        marks = [c for c in trailing.replace("…", ".") if c in SPOKEN_PUNCTUATION]
        return core.strip("\"'“”‘’()[]{}«»"), (marks[-1] if marks else "")

    def _core(self, core: str) -> list[str]:
        lowered = core.lower()
        if lowered in UNITS and RE_NUMBER.match(self.previous or "x"):
            singular, plural = UNITS[lowered]
            return (singular if _plain_number(self.previous) == 1 else plural).split()
        if self.previous in MONTHS and re.fullmatch(r"\d{1,2}(st|nd|rd|th)?", lowered):
            return _spoken(num2words(int(re.match(r"\d+", lowered).group()), to="ordinal"))
        if m := RE_CURRENCY.match(core):
            return self._currency(*m.groups())
        if m := RE_PERCENT.match(core):
            return _spoken(number_words(m.group(1))) + ["percent"]
        if m := RE_TIME.match(core):
            return self._time(*m.groups())
        if m := RE_ISO_DATE.match(core):
            year, month, day = (int(g) for g in m.groups())
            if 1 <= month <= 12 and 1 <= day <= 31:
                return [MONTHS[month - 1]] + _spoken(num2words(day, to="ordinal")) + _spoken(num2words(year, to="year"))
        if m := RE_ORDINAL.match(core):
            return _spoken(num2words(int(m.group(1)), to="ordinal"))
        if RE_NUMBER.match(core):
            return _spoken(number_words(core))
        if m := RE_RANGE.match(core):
            return _spoken(number_words(m.group(1))) + ["to"] + _spoken(number_words(m.group(2)))
        if m := RE_FRACTION.match(core):
            return _spoken(number_words(m.group(1))) + ["over"] + _spoken(number_words(m.group(2)))
        if (m := RE_NUMBER_UNIT.match(core)) and m.group(2).lower() in UNITS:
            singular, plural = UNITS[m.group(2).lower()]
            unit = singular if _plain_number(m.group(1)) == 1 else plural
            return _spoken(number_words(m.group(1))) + unit.split()
        if core in SYMBOL_WORDS:
            return [SYMBOL_WORDS[core]]
        return self._letters(core)

    def _letters(self, core: str) -> list[str]:
        """Ordinary words: transliterate non-Latin letters, split on symbols, read digits inside words."""
        text = core.replace("&", " and ").replace("/", " ").replace("+", " plus ").replace("_", " ")
        if any(ord(c) > 127 for c in text):  # transliterate letters of other scripts; symbols are not letters
            text = "".join(
                unidecode(c) if ord(c) > 127 and unicodedata.category(c).startswith("L") else c
                for c in unicodedata.normalize("NFC", text)
            )
        words: list[str] = []
        for part in re.split(r"[\s]+", text):
            for chunk in re.findall(r"[A-Za-z]+(?:['’][A-Za-z]+)*(?:-[A-Za-z]+)*|\d+(?:\.\d+)?|[^\sA-Za-z\d]", part):
                if chunk[0].isalpha():
                    words.append(chunk.replace("’", "'"))
                elif chunk[0].isdigit():
                    words += _spoken(number_words(chunk))
                elif chunk in SYMBOL_WORDS:
                    words.append(SYMBOL_WORDS[chunk])
                elif chunk not in "-'\"—–":
                    self.dropped.append(chunk)
                    log.warning("dropped unspeakable character %r", chunk)
        return words

    def _currency(self, sign: str, symbol: str, amount: str, scale: str | None) -> list[str]:
        unit_one, units, sub_one, subs = CURRENCIES[symbol]
        words = ["minus"] if sign else []
        if scale:
            return words + _spoken(number_words(amount)) + [SCALE[scale.lower()], units]
        value = amount.replace(",", "")
        whole, _, cents = value.partition(".")
        whole_n = int(whole)
        words += _spoken(num2words(whole_n)) + [unit_one if whole_n == 1 else units]
        if cents and int(cents[:2].ljust(2, "0")):
            cents_n = int(cents[:2].ljust(2, "0"))
            words += ["and"] + _spoken(num2words(cents_n)) + [sub_one if cents_n == 1 else subs]
        return words

    def _time(self, hours: str, minutes: str, meridiem: str | None) -> list[str]:
        h, m = int(hours), int(minutes)
        words = _spoken(num2words(h))
        if m == 0:
            words += [] if meridiem else ["o'clock"]
        elif m < 10:
            words += ["oh"] + _spoken(num2words(m))
        else:
            words += _spoken(num2words(m))
        if meridiem:
            words += ["a", "m"] if meridiem.lower().startswith("a") else ["p", "m"]
        return words

    def _url(self, piece: str) -> list[str]:
        core, tail = self._split_punctuation(piece)
        host = re.sub(r"^(?:https?://)?(?:www\.)?", "", core, flags=re.I).split("/")[0]
        words = " dot ".join(host.split(".")).split()
        self.previous = ""
        return words[:-1] + [words[-1] + tail] if words else []

    def _email(self, piece: str) -> list[str]:
        core, tail = self._split_punctuation(piece)
        user, domain = core.split("@", 1)
        words = self._letters(user.replace(".", " dot ")) + ["at"] + " dot ".join(domain.split(".")).split()
        self.previous = ""
        return words[:-1] + [words[-1] + tail]


def normalize_text(text: str) -> list[str]:
    """Whole text to spoken words (a fresh normaliser)."""
    return TextNormalizer().normalize(text)
